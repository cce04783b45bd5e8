package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cellResult is one cell: one configuration at one client count in one
// round (or one pgbench run).
type cellResult struct {
	ok     int           // 201s (pgbench: transactions) that started and ended in the window
	window time.Duration // the measured window
	lat    []time.Duration
	cpu    cpuUse
	// rt: PostgreSQL round trips (the proxy's Syncs and Queries) in the
	// window, when rtOK; ended: withdrawals (pgbench: transactions) that
	// ended in it, however they started or were answered.
	rt    int64
	rtOK  bool
	ended int
	// wtx: transactions that wrote (PostgreSQL's transaction ids taken,
	// cluster-wide) in the window, when wtxOK.
	wtx   int64
	wtxOK bool

	sent         int            // requests over the whole cell, warm-up included
	mints        int            // of them, the submit tokens minted (POST /api/v1/submit-tokens)
	other        map[string]int // non-201 answers over the whole cell: "503 busy" -> count
	otherSample  map[string]string
	notSucceeded map[string]int // 201s whose status is not "succeeded"
	transport    int            // requests without an answer
	firstErr     string

	err     string  // the cell did not run (or pgbench failed)
	tps     float64 // pgbench's own "tps =" figure, a cross-check
	failed  int     // pgbench: failed transactions
	samples int     // pgbench: transactions in its log
}

func (r *cellResult) rate() float64 {
	if r.window <= 0 {
		return 0
	}
	return float64(r.ok) / r.window.Seconds()
}

// roundTripsPer is the window's round trips per withdrawal (pgbench: per
// transaction) that ended in it. Those that ended in it, not those that
// also started in it (ok): each client has one in flight at either edge
// of the window, whose round trips partly fall inside; counting the ends
// counts, on average, one withdrawal's worth of them per client and edge.
func (r *cellResult) roundTripsPer() (float64, bool) {
	if !r.rtOK || r.ended == 0 {
		return 0, false
	}
	return float64(r.rt) / float64(r.ended), true
}

// writeTxsPer is the window's write transactions per withdrawal (pgbench:
// per transaction) that ended in it, counted as roundTripsPer counts.
func (r *cellResult) writeTxsPer() (float64, bool) {
	if !r.wtxOK || r.ended == 0 {
		return 0, false
	}
	return float64(r.wtx) / float64(r.ended), true
}

func (r *cellResult) nonOK() int {
	n := r.transport + r.failed
	for _, c := range r.other {
		n += c
	}
	for _, c := range r.notSucceeded {
		n += c
	}
	return n
}

func (r *cellResult) progressLine() string {
	if r.err != "" && r.ok == 0 {
		return "ERROR " + r.err
	}
	s := fmt.Sprintf("%8.0f/s  p50 %-8s p99 %-8s cpu svc %s pg %s redis %s client %s",
		r.rate(), fmtDur(percentile(r.lat, 0.50)), fmtDur(percentile(r.lat, 0.99)),
		fmtCPU(r.cpu[cpuSvc]), fmtCPU(r.cpu[cpuPG]), fmtCPU(r.cpu[cpuRedis]), fmtCPU(r.cpu[cpuLoad]))
	if r.cpu[cpuProxy] != cpuNA {
		s += " proxy " + fmtCPU(r.cpu[cpuProxy])
	}
	if rt, ok := r.roundTripsPer(); ok {
		s += fmt.Sprintf("  %.2f pg round trips/withdrawal", rt)
	}
	if r.mints > 0 && r.sent > 0 {
		s += fmt.Sprintf("  %.2f tokens minted/withdrawal", float64(r.mints)/float64(r.sent))
	}
	if r.tps > 0 {
		s += fmt.Sprintf("  (pgbench's own tps %.0f)", r.tps)
	}
	if n := r.nonOK(); n > 0 {
		s += fmt.Sprintf("  NOT OK %d: %s", n, r.nonOKSummary())
	}
	if r.err != "" {
		s += "  ERROR " + r.err
	}
	return s
}

// nonOKSummary lists what was not a plain success, most frequent first.
func (r *cellResult) nonOKSummary() string {
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, n := range r.other {
		all = append(all, kv{k, n})
	}
	for k, n := range r.notSucceeded {
		all = append(all, kv{"201 " + k, n})
	}
	if r.transport > 0 {
		all = append(all, kv{"no answer", r.transport})
	}
	if r.failed > 0 {
		all = append(all, kv{"failed tx", r.failed})
	}
	slices.SortFunc(all, func(a, b kv) int { return b.n - a.n })
	var parts []string
	for _, e := range all {
		parts = append(parts, fmt.Sprintf("%s ×%d", e.k, e.n))
	}
	return strings.Join(parts, ", ")
}

// tokenMode is where a withdrawal's Idempotency-Key comes from.
type tokenMode int

const (
	plainKeys   tokenMode = iota // a fresh plain key (submit tokens off)
	mintEach                     // a submit token minted just before (POST /api/v1/submit-tokens)
	chainTokens                  // the token the answer before offered (Next-Submit-Token), else minted
)

// tokensOf is a group's tokenMode.
func tokensOf(g string) tokenMode {
	switch g {
	case groupTokens, groupTokensB, groupFloorMinted:
		return mintEach
	case groupChain:
		return chainTokens
	}
	return plainKeys
}

// runCell runs one cell against a service: every user is one client
// looping POST /api/v1/withdrawals with a fresh key, warmup unmeasured,
// then duration measured. Only requests that start and end in the window
// count; latencies are those of the 201s among them. A withdrawal's time
// includes its mint, if any (tokens).
func runCell(ctx context.Context, a *api, users []*user, warmup, duration time.Duration, probe cpuProbe, tokens tokenMode) *cellResult {
	res := &cellResult{window: duration, cpu: unknownCPU(), other: map[string]int{}, otherSample: map[string]string{}, notSucceeded: map[string]int{}}
	start := time.Now()
	w0 := start.Add(warmup)
	w1 := w0.Add(duration)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if !sleepUntil(ctx, w0) {
			return
		}
		b := probe.sample()
		if sleepUntil(ctx, w1) {
			e := probe.sample()
			res.cpu = cpuShare(b, e)
			res.rt, res.rtOK = roundTrips(b, e)
			res.wtx, res.wtxOK = writeTxs(b, e)
		}
	}()

	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				lat                     []time.Duration
				ok, sent, transport     int
				mints                   int
				next                    string // chainTokens: the token the last answer offered
				ended                   int
				other                   = map[string]int{}
				sample                  = map[string]string{}
				notSucceeded            = map[string]int{}
				firstErr                string
				body                    []byte
				succeeded, pendingBytes = []byte(`"status":"succeeded"`), []byte(`"status":"`)
			)
			for ctx.Err() == nil && time.Now().Before(w1) {
				u.sent++
				cents := 1 + (u.sent-1)%amountCycle // distinct bodies: no 429 from the repeat window
				body = fmt.Appendf(body[:0], `{"amount":"%d.%02d"}`, cents/100, cents%100)
				key := "ld-wd-" + strconv.FormatInt(u.sent, 10)
				t0 := time.Now()
				var (
					st   int
					resp []byte
					hdr  http.Header
					err  error
				)
				mintFailed := false
				switch {
				case tokens == chainTokens && next != "":
					key, next = next, ""
				case tokens != plainKeys:
					mints++
					key, st, resp, err = mintToken(ctx, a, u.token)
					mintFailed = err != nil || key == ""
				}
				if !mintFailed {
					st, resp, hdr, err = a.send(ctx, http.MethodPost, "/api/v1/withdrawals", u.token, key, body)
					if tokens == chainTokens && hdr != nil {
						next = hdr.Get("Next-Submit-Token")
					}
				}
				t1 := time.Now()
				sent++
				in := !t0.Before(w0) && !t1.After(w1)
				if !t1.Before(w0) && !t1.After(w1) && ctx.Err() == nil {
					ended++
				}
				switch {
				case err != nil:
					if ctx.Err() != nil {
						break // interrupted: not the service's fault
					}
					transport++
					u.uncertain++
					if firstErr == "" {
						firstErr = err.Error()
					}
				case st == http.StatusCreated && !mintFailed:
					if bytes.Contains(resp, succeeded) {
						u.balance -= cents
						if in {
							ok++
							lat = append(lat, t1.Sub(t0))
						}
						break
					}
					status := "?"
					if i := bytes.Index(resp, pendingBytes); i >= 0 {
						rest := resp[i+len(pendingBytes):]
						if j := bytes.IndexByte(rest, '"'); j >= 0 {
							status = string(rest[:j])
						}
					}
					if status != "failed" { // failed: refunded, the balance is back
						u.uncertain++
					}
					notSucceeded[status]++
				default:
					var p struct{ Code, Detail string }
					_ = json.Unmarshal(resp, &p)
					k := fmt.Sprintf("%d %s", st, p.Code)
					if mintFailed {
						k = "submit-tokens " + k
					}
					other[k]++
					if _, seen := sample[k]; !seen {
						sample[k] = truncate(string(resp), 300)
					}
					if st >= 500 {
						u.uncertain++
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			res.ok += ok
			res.sent += sent
			res.mints += mints
			res.ended += ended
			res.transport += transport
			res.lat = append(res.lat, lat...)
			for k, n := range other {
				res.other[k] += n
				if _, seen := res.otherSample[k]; !seen {
					res.otherSample[k] = sample[k]
				}
			}
			for k, n := range notSucceeded {
				res.notSucceeded[k] += n
			}
			if res.firstErr == "" {
				res.firstErr = firstErr
			}
		}()
	}
	wg.Wait()
	<-sampled
	slices.Sort(res.lat)
	return res
}

// sleepUntil sleeps until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// mintToken mints a withdrawal submit token for the session token. It
// returns the token, or "" with the answer when none was minted.
func mintToken(ctx context.Context, a *api, session string) (string, int, []byte, error) {
	st, resp, err := a.do(ctx, http.MethodPost, "/api/v1/submit-tokens", session, "", []byte(`{"purpose":"withdrawal"}`))
	if err != nil || st != http.StatusCreated {
		return "", st, resp, err
	}
	var t struct{ Token string }
	if json.Unmarshal(resp, &t) != nil || t.Token == "" {
		return "", st, resp, nil
	}
	return t.Token, st, resp, nil
}
