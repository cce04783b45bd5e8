// Package fallback is a lock.Backend that uses a primary backend (Redis)
// while it answers and a secondary one (the database) while it does not,
// switching with a circuit breaker:
//
//   - closed: acquires go to the primary. An acquire that fails because
//     the primary is unreachable (lock.ErrUnavailable, with the caller's
//     context still live) opens the breaker and is retried on the
//     secondary at once, so a Redis outage does not fail the request.
//   - open: acquires go to the secondary. After Cooldown one acquire
//     probes the primary (half-open); if it answers the breaker closes.
//
// A lease is released and refreshed on the backend that granted it.
//
// # Correctness across the switch
//
// While the breaker switches, two holders of "the same" lock on different
// backends are possible: a lease granted by Redis just before it became
// unreachable from this process is invisible to the database, and a Redis
// that is unreachable from one instance may still serve another. This
// package narrows the window where it can: for Drain after the breaker
// closes, acquires take the lock on both backends, so leases granted by
// the secondary during the outage are respected. But no lock can be the
// last line of defence. What keeps data correct is the resource: fencing
// tokens, unique constraints and conditional updates in the database.
//
// Fences compare across the switch when both backends grant
// max(last + 1, clock µs): memlock and sqllock always do, redislock with
// Options.ClockFences (redlock passes it to its nodes). Without it a
// resource that accepted a database fence would refuse Redis's counter
// fences as stale long after Redis is back. The clocks of the two servers
// may differ by their skew: right after a switch a writer may be refused
// as stale for up to that long (refused, never let through twice).
package fallback

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// State is the breaker's state.
type State int32

// Breaker states.
const (
	Closed   State = iota // the primary serves
	Open                  // the secondary serves
	HalfOpen              // the secondary serves; one acquire probes the primary
)

// String returns the state's name: "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Options configure a Backend. A nil *Options means all defaults.
type Options struct {
	// Cooldown is how long the breaker stays open before probing the
	// primary again. Default: 2s.
	Cooldown time.Duration

	// Drain is how long after the breaker closes acquires also take the
	// lock on the secondary, at most the longest TTL it granted while open.
	// Default: that TTL (0 means the default; a negative value disables).
	Drain time.Duration

	// OnStateChange, if set, is called after every state change, with the
	// error that caused it (nil on recovery). It runs synchronously on the
	// acquiring goroutine: keep it fast (count, log).
	OnStateChange func(from, to State, cause error)
}

// Stats are the Backend's counters since it was created.
type Stats struct {
	State             State  // now
	PrimaryAcquires   uint64 // leases granted by the primary
	SecondaryAcquires uint64 // leases granted by the secondary (including drain)
	// Opened counts outages begun (closed to open; a failed probe, half-open
	// back to open, is not one), Recovered the returns to closed.
	Opened, Recovered  uint64
	LastOpenedAt       time.Time // when the last outage began (zero: none yet)
	LastOpenedBecause  string    // the error that began it
	DrainingUntil      time.Time // after a return to the primary, leases still taken on the secondary until then
	HeldOnSecondaryNow int       // leases of this process now held on the secondary
}

// Backend implements lock.Backend over a primary and a secondary backend.
// It is safe for concurrent use.
type Backend struct {
	primary, secondary lock.Backend
	opts               Options

	mu          sync.Mutex // guards the fields below
	state       State
	openedAt    time.Time
	because     string
	probing     bool
	maxTTL      time.Duration // longest TTL the secondary granted while open
	drainUntil  time.Time
	held        map[string]*holding // owner -> where it is held
	sinceSweep  int
	openedN     uint64
	recoveredN  uint64
	primaryN    atomic.Uint64
	secondaryN  atomic.Uint64
	heldOnSecon int
}

type holding struct {
	primary, secondary bool
	expires            time.Time
}

var (
	_ lock.Backend = (*Backend)(nil)
	_ lock.Waiter  = (*Backend)(nil)
)

var errNoWait = errors.New("fallback: no release notifications while degraded")

// Wait implements lock.Waiter with the primary's notifications while the
// breaker is closed; otherwise it fails and the Locker polls.
func (b *Backend) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	if w, ok := b.primary.(lock.Waiter); ok && b.State() == Closed {
		return w.Wait(ctx, key, owner)
	}
	return nil, nil, errNoWait
}

// Leave implements lock.Waiter: it leaves the queues of both backends.
func (b *Backend) Leave(ctx context.Context, key, owner string) error {
	var errs []error
	for _, l := range []lock.Backend{b.primary, b.secondary} {
		if w, ok := l.(lock.Waiter); ok {
			errs = append(errs, w.Leave(ctx, key, owner))
		}
	}
	return errors.Join(errs...)
}

// New returns a Backend over primary and secondary; lock.New makes a
// Locker of it.
func New(primary, secondary lock.Backend, opts *Options) *Backend {
	if primary == nil || secondary == nil {
		panic("fallback: New needs a primary and a secondary Backend")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Cooldown <= 0 {
		o.Cooldown = 2 * time.Second
	}
	return &Backend{primary: primary, secondary: secondary, opts: o, held: make(map[string]*holding)}
}

// State returns the breaker's state.
func (b *Backend) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Degraded reports whether the secondary serves (the breaker is not
// closed): what a readiness probe reports as "degraded".
func (b *Backend) Degraded() bool { return b.State() != Closed }

// Stats returns the Backend's counters.
func (b *Backend) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{
		State: b.state, PrimaryAcquires: b.primaryN.Load(), SecondaryAcquires: b.secondaryN.Load(),
		Opened: b.openedN, Recovered: b.recoveredN, LastOpenedAt: b.openedAt, LastOpenedBecause: b.because,
		DrainingUntil: b.drainUntil, HeldOnSecondaryNow: b.heldOnSecon,
	}
}

// route says where an acquire goes: the primary (probe: as the half-open
// probe), or the secondary.
func (b *Backend) route() (primary, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		return true, false
	case Open:
		if time.Since(b.openedAt) < b.opts.Cooldown {
			return false, false
		}
		b.setState(HalfOpen, nil)
		fallthrough
	default: // HalfOpen
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
}

// setState changes state and calls the hook; b.mu is held.
func (b *Backend) setState(to State, cause error) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	if b.opts.OnStateChange != nil {
		b.opts.OnStateChange(from, to, cause)
	}
}

func (b *Backend) trip(cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.openedAt = time.Now()
	b.because = cause.Error()
	if b.state == Closed {
		b.openedN++
	}
	b.setState(Open, cause)
}

func (b *Backend) recover() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if b.state == Closed {
		return
	}
	drain := b.opts.Drain
	if drain == 0 {
		drain = b.maxTTL
	}
	if until := time.Now().Add(drain); drain > 0 && until.After(b.drainUntil) {
		b.drainUntil = until
	}
	b.maxTTL = 0
	b.recoveredN++
	b.setState(Closed, nil)
}

// ProbeKey is the lock name Probe takes on the primary. Do not use it for
// anything else.
const ProbeKey = "onceguard-fallback-probe"

// Probe tries the primary now, as an acquire's half-open probe would,
// when the breaker is open, its cooldown has passed and no probe is in
// flight: it takes and releases ProbeKey on the primary, closes the
// breaker if the primary answered (drain included, as after any probe),
// and opens it again for another cooldown if it did not. In any other
// state it does nothing. It returns the state after.
//
// Acquires move the breaker; without them (a quiet service, or one whose
// traffic stopped) it would stay open, and report degraded, after the
// primary came back. Call Probe from a readiness check or a ticker.
func (b *Backend) Probe(ctx context.Context) State {
	if b.State() == Closed {
		return Closed
	}
	if _, probe := b.route(); !probe {
		return b.State()
	}
	owner := fmt.Sprintf("probe-%x", rand.Uint64())
	_, err := b.primary.Acquire(ctx, lock.Request{Key: ProbeKey, Owner: owner, TTL: time.Second})
	switch {
	case down(ctx, err):
		b.trip(err)
	case ctx.Err() != nil && err != nil:
		// The caller gave up: no answer either way.
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	default:
		// An answer (a lease, or ErrNotAcquired: another process's probe
		// holds it): the primary serves.
		b.recover()
		if err == nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = b.primary.Release(rctx, ProbeKey, owner)
			cancel()
		}
	}
	return b.State()
}

// down reports whether err means the backend could not answer, as opposed
// to the caller giving up.
func down(ctx context.Context, err error) bool {
	return err != nil && errors.Is(err, lock.ErrUnavailable) && ctx.Err() == nil
}

// Acquire implements lock.Backend.
func (b *Backend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	usePrimary, probe := b.route()
	if usePrimary {
		g, err := b.primary.Acquire(ctx, r)
		if !down(ctx, err) {
			if probe {
				b.recover()
			}
			if err != nil {
				return g, err
			}
			return b.drain(ctx, r, g)
		}
		b.trip(err) // and serve this request from the secondary
	}
	g, err := b.secondary.Acquire(ctx, r)
	if err == nil {
		b.secondaryN.Add(1)
		b.track(r, false, true)
	}
	return g, err
}

// drain also takes the lock on the secondary while leases it granted
// during the outage may still be held; otherwise it records the primary's
// grant.
func (b *Backend) drain(ctx context.Context, r lock.Request, g lock.Grant) (lock.Grant, error) {
	b.mu.Lock()
	draining := time.Now().Before(b.drainUntil)
	b.mu.Unlock()
	if !draining {
		b.primaryN.Add(1)
		b.track(r, true, false)
		return g, nil
	}
	g2, err := b.secondary.Acquire(ctx, lock.Request{Key: r.Key, Owner: r.Owner, TTL: r.TTL})
	if err != nil {
		// Held on the secondary (or it is unreachable): give the primary
		// back and report it held.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = b.primary.Release(rctx, r.Key, r.Owner)
		cancel()
		if errors.Is(err, lock.ErrNotAcquired) || !down(ctx, err) {
			return lock.Grant{}, fmt.Errorf("fallback: acquire %q: held on the secondary while draining: %w", r.Key, err)
		}
		return lock.Grant{}, err
	}
	b.primaryN.Add(1) // a lease, on both
	b.track(r, true, true)
	return lock.Grant{Fence: max(g.Fence, g2.Fence)}, nil
}

const sweepEvery = 1024

func (b *Backend) track(r lock.Request, primary, secondary bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.sinceSweep++; b.sinceSweep >= sweepEvery {
		b.sinceSweep = 0
		for o, h := range b.held {
			if now.After(h.expires) {
				b.forget(o, h)
			}
		}
	}
	b.held[r.Owner] = &holding{primary: primary, secondary: secondary, expires: now.Add(r.TTL)}
	if secondary {
		b.heldOnSecon++
		if b.state != Closed {
			b.maxTTL = max(b.maxTTL, r.TTL)
		}
	}
}

// forget drops an owner's record; b.mu is held.
func (b *Backend) forget(owner string, h *holding) {
	delete(b.held, owner)
	if h.secondary {
		b.heldOnSecon--
	}
}

func (b *Backend) where(owner string) (*holding, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[owner]
	if !ok {
		return nil, false
	}
	c := *h
	return &c, true
}

// Release implements lock.Backend: it releases on the backend(s) that
// granted the lease.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	h, ok := b.where(owner)
	if !ok {
		return fmt.Errorf("fallback: release %q: %w", key, lock.ErrExpired)
	}
	err := b.both(ctx, h, func(l lock.Backend) error { return l.Release(ctx, key, owner) })
	if err == nil || errors.Is(err, lock.ErrNotHeld) {
		b.mu.Lock()
		if cur, ok := b.held[owner]; ok {
			b.forget(owner, cur)
		}
		b.mu.Unlock()
	}
	return err
}

// Refresh implements lock.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	h, ok := b.where(owner)
	if !ok {
		return fmt.Errorf("fallback: refresh %q: %w", key, lock.ErrExpired)
	}
	err := b.both(ctx, h, func(l lock.Backend) error { return l.Refresh(ctx, key, owner, ttl) })
	if err == nil {
		b.mu.Lock()
		if cur, ok := b.held[owner]; ok {
			cur.expires = time.Now().Add(ttl)
			if cur.secondary && cur.expires.After(b.drainUntil) {
				// A lease on the secondary that is renewed outlives the
				// drain the breaker's closing started: acquires on the
				// primary must keep taking the secondary as long as it lives.
				b.drainUntil = cur.expires
			}
		}
		b.mu.Unlock()
	}
	return err
}

// both runs f on the backends in h and returns the first error.
func (b *Backend) both(ctx context.Context, h *holding, f func(lock.Backend) error) error {
	var errs []error
	if h.primary {
		err := f(b.primary)
		if down(ctx, err) {
			b.trip(err)
		}
		errs = append(errs, err)
	}
	if h.secondary {
		errs = append(errs, f(b.secondary))
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
