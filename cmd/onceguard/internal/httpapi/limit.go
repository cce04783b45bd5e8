package httpapi

import (
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxLimiterEntries bounds every limiter's memory: past it, expired
// entries are swept, and if none expired the oldest-looking ones go (an
// attacker who floods with fresh addresses resets counts, never memory).
const maxLimiterEntries = 50_000

// failures counts attempts per key in a fixed window (failed sign-ins;
// sign-ups): after max of them a key is refused until its window ends.
type failures struct {
	max    int
	window time.Duration

	mu sync.Mutex
	m  map[string]*failWindow
}

type failWindow struct {
	n   int
	end time.Time
}

func newFailures(max int, window time.Duration) *failures {
	return &failures{max: max, window: window, m: map[string]*failWindow{}}
}

// reserve counts an attempt of key as a failure before it is made, and
// returns how long key is refused instead (0: counted, go ahead). Checking
// and counting are one step, so attempts made at the same time cannot all
// pass a check that only the ones before them counted toward: an attempt
// that then succeeds (or never got to try) gives its count back with
// undo.
func (f *failures) reserve(key string, now time.Time) time.Duration {
	wait, _ := f.reserveN(key, now)
	return wait
}

// reserveN is reserve, also returning how many attempts key has in its
// window with this one (0 when refused or f is off).
func (f *failures) reserveN(key string, now time.Time) (time.Duration, int) {
	if f == nil || f.max <= 0 {
		return 0, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.window1(key, now)
	if w.n >= f.max {
		return w.end.Sub(now), 0
	}
	w.n++
	return 0, w.n
}

// has tells whether key has an attempt in a window that has not ended.
func (f *failures) has(key string, now time.Time) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.m[key]
	return ok && w.n > 0 && now.Before(w.end)
}

// undo gives back an attempt counted by reserve. A key left with no
// attempt is dropped: successes leave nothing behind.
func (f *failures) undo(key string) {
	if f == nil || f.max <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if w, ok := f.m[key]; ok && w.n > 0 {
		if w.n--; w.n == 0 {
			delete(f.m, key)
		}
	}
}

// attempt is one key of one limiter.
type attempt struct {
	f   *failures
	key string
}

// reserveAll reserves an attempt on each in order. If one refuses, it
// gives back those it took and returns how long that one is refused.
func reserveAll(now time.Time, as ...attempt) time.Duration {
	for i, a := range as {
		if wait := a.f.reserve(a.key, now); wait > 0 {
			undoAll(as[:i]...)
			return wait
		}
	}
	return 0
}

// undoAll gives back an attempt reserved on each.
func undoAll(as ...attempt) {
	for _, a := range as {
		a.f.undo(a.key)
	}
}

// window1 returns key's current window, opening a new one if it has none
// or its last has ended. f.mu is held.
func (f *failures) window1(key string, now time.Time) *failWindow {
	w, ok := f.m[key]
	if !ok || !now.Before(w.end) {
		if len(f.m) >= maxLimiterEntries {
			sweep(f.m, func(w *failWindow) bool { return !now.Before(w.end) })
		}
		w = &failWindow{end: now.Add(f.window)}
		f.m[key] = w
	}
	return w
}

// forget clears key (a success).
func (f *failures) forget(key string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
}

func (f *failures) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}

// sweep deletes the entries expired says are dead and, if the map is still
// full, a quarter of the rest (Go's map order is random enough here).
func sweep[V any](m map[string]V, expired func(V) bool) {
	for k, v := range m {
		if expired(v) {
			delete(m, k)
		}
	}
	for k := range m {
		if len(m) < maxLimiterEntries*3/4 {
			break
		}
		delete(m, k)
	}
}

// rates is a token bucket per key: rate tokens a second, up to burst.
type rates struct {
	rate, burst float64

	mu sync.Mutex
	m  map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRates(rate float64, burst int) *rates {
	if rate <= 0 {
		return nil
	}
	return &rates{rate: rate, burst: float64(max(burst, 1)), m: map[string]*bucket{}}
}

// take spends a token of key; when there is none it returns how long until
// there is one.
func (r *rates) take(key string, now time.Time) time.Duration {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.m[key]
	if !ok {
		if len(r.m) >= maxLimiterEntries {
			full := time.Duration(r.burst / r.rate * float64(time.Second))
			sweep(r.m, func(b *bucket) bool { return now.Sub(b.last) >= full })
		}
		b = &bucket{tokens: r.burst, last: now}
		r.m[key] = b
	}
	b.tokens = math.Min(r.burst, b.tokens+now.Sub(b.last).Seconds()*r.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration((1 - b.tokens) / r.rate * float64(time.Second))
}

// clientAddr is who is asking, for the limits: the configured header set
// by a trusted proxy in front (its last address), else the connection's
// remote host.
func (s *server) clientAddr(r *http.Request) string {
	if h := s.cfg.ClientIPHeader; h != "" {
		if v := r.Header.Values(h); len(v) > 0 {
			last := v[len(v)-1]
			for i := len(last) - 1; i >= 0; i-- {
				if last[i] == ',' {
					last = last[i+1:]
					break
				}
			}
			if ip := net.ParseIP(strings.TrimSpace(last)); ip != nil {
				return limitKey(ip)
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip != nil {
		return limitKey(ip)
	}
	return host
}

// limitKey is the client an address counts as: an IPv4 address itself, an
// IPv6 one its /64, which one host or subscriber has whole (every address
// of it would otherwise be a fresh client to every limit).
func limitKey(ip net.IP) string {
	if ip.To4() != nil {
		return ip.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// retryAfter is d in whole seconds, at least 1, for Retry-After.
func retryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
