package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// cycleTTL is the lock TTL of every cycle, for every library.
const cycleTTL = 10 * time.Second

// The groups of scenarios and libraries: the Redis lock libraries on the
// shared Redis server (and the redis-benchmark ceiling), and onceguard's
// other backends with the bare PostgreSQL baseline.
const (
	groupRedis    = "redis"
	groupBackends = "backends"
)

// scenario is one workload shape, run by every library of its group.
type scenario struct {
	name       string
	group      string
	goroutines int
	sameKey    bool // all goroutines on one key (else one key each)
	blocking   bool // blocking acquire (else one try per attempt)
	// paired: the cell runs every library of the group in turn, a block
	// each, in the same cell (see runPaired).
	paired bool
}

var scenarios = []scenario{
	{name: "distinct-1", group: groupRedis, goroutines: 1},
	{name: "paired-1", group: groupRedis, goroutines: 1, paired: true},
	{name: "distinct-16", group: groupRedis, goroutines: 16},
	{name: "distinct-64", group: groupRedis, goroutines: 64},
	{name: "paired-16", group: groupRedis, goroutines: 16, paired: true},
	{name: "paired-64", group: groupRedis, goroutines: 64, paired: true},
	{name: "onekey-64-try", group: groupRedis, goroutines: 64, sameKey: true},
	{name: "onekey-16-block", group: groupRedis, goroutines: 16, sameKey: true, blocking: true},
	{name: "backends-1", group: groupBackends, goroutines: 1},
	{name: "backends-16", group: groupBackends, goroutines: 16},
}

// result is one cell (library × scenario × round).
type result struct {
	window   time.Duration
	cycles   int64   // acquire+release pairs completed inside the window
	attempts int64   // acquire attempts started and finished inside the window (try scenarios)
	handoffs int64   // acquisitions by another goroutine than the previous holder (blocking)
	perG     []int64 // acquisitions per goroutine inside the window
	lat      []time.Duration
	errs     int64
	firstErr error
	leftover int64 // locks of the cell still held after the workers stopped (deleted then)

	// blocks (paired scenarios): the time of each pass's block, by pass
	// number; 0 where the library ran no block in that pass or one of the
	// block's cycles failed. Blocks of the same pass are compared in pairs.
	blocks []time.Duration

	// CPU use over the measured window, in cores: the lock server's and
	// this process's (-1: unknown; cpuNA: no server process).
	serverCPU, benchCPU float64

	// Over the measured window: heap objects this process allocated, and
	// commands the lock's server processed (-1: unknown).
	allocs, cmds int64
}

// perCycle returns n per cycle of the window, NaN when unknown.
func (r *result) perCycle(n int64) float64 {
	if n < 0 || r.cycles == 0 {
		return math.NaN()
	}
	return float64(n) / float64(r.cycles)
}

func (r *result) cyclesPerSec() float64   { return float64(r.cycles) / r.window.Seconds() }
func (r *result) attemptsPerSec() float64 { return float64(r.attempts) / r.window.Seconds() }
func (r *result) handoffsPerSec() float64 { return float64(r.handoffs) / r.window.Seconds() }

// fairness is Jain's index over per-goroutine acquisition counts.
func (r *result) fairness() float64 { return jain(r.perG) }

func jain(xs []int64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += float64(x)
		s2 += float64(x) * float64(x)
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

// runCell runs one scenario on one library: workers start at once, run
// warmup unmeasured, then duration measured, then stop. Only cycles that
// start and end inside the measured window count. keyBase is fresh for
// every cell, and every key under it is deleted afterwards.
func runCell(lib *library, sc scenario, keyBase string, warmup, duration time.Duration) *result {
	res := &result{window: duration, perG: make([]int64, sc.goroutines), serverCPU: -1, benchCPU: -1, allocs: -1, cmds: -1}
	start := time.Now()
	t0 := start.Add(warmup)
	t1 := t0.Add(duration)

	// Sample CPU use at the window's edges.
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		time.Sleep(time.Until(t0))
		a := sampleCPU(lib)
		time.Sleep(time.Until(t1))
		b := sampleCPU(lib)
		res.serverCPU, res.benchCPU = cpuShare(a, b)
		res.allocs = int64(b.mallocs - a.mallocs)
		if a.cmdsOK && b.cmdsOK {
			res.cmds = b.cmds - a.cmds - 2 // less the first sample's INFO stats and INFO cpu
		}
	}()

	// opCtx bounds every call of the cell (a hung server cannot hang the
	// run); waitCtx additionally ends blocking waits at the window's end.
	opCtx, cancelOp := context.WithDeadline(context.Background(), t1.Add(15*time.Second))
	defer cancelOp()
	waitCtx, cancelWait := context.WithDeadline(opCtx, t1)
	defer cancelWait()

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex // guards res.lat, res.errs, res.firstErr
		last     atomic.Int64
		handoffs atomic.Int64
	)
	last.Store(-1)
	fail := func(err error) {
		mu.Lock()
		res.errs++
		if res.firstErr == nil {
			res.firstErr = err
		}
		mu.Unlock()
		time.Sleep(time.Millisecond) // no hot loop on a broken server
	}
	for g := range sc.goroutines {
		key := keyBase
		if !sc.sameKey {
			key = fmt.Sprintf("%s/g%d", keyBase, g)
		}
		w := lib.newWorker(key)
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			var cycles, attempts, acquired int64
			defer func() {
				mu.Lock()
				res.lat = append(res.lat, lat...)
				res.cycles += cycles
				res.attempts += attempts
				res.perG[g] = acquired
				mu.Unlock()
			}()
			for {
				begin := time.Now()
				if !begin.Before(t1) {
					return
				}
				var ok bool
				var err error
				if sc.blocking {
					err = w.block(waitCtx)
					ok = err == nil
					if err != nil && waitCtx.Err() != nil {
						return // the window ended while waiting
					}
				} else {
					ok, err = w.try(opCtx)
				}
				if err != nil {
					fail(err)
					continue
				}
				in := !begin.Before(t0)
				if ok {
					got := time.Now()
					if sc.blocking {
						prev := last.Swap(int64(g))
						if prev != int64(g) && !got.Before(t0) && got.Before(t1) {
							handoffs.Add(1)
						}
					}
					if !got.Before(t0) && got.Before(t1) {
						acquired++
					}
					if err := w.unlock(opCtx); err != nil {
						fail(fmt.Errorf("unlock: %w", err))
						continue
					}
				}
				end := time.Now()
				if in && end.Before(t1) {
					attempts++
					if ok {
						cycles++
						lat = append(lat, end.Sub(begin))
					}
				}
			}
		}()
	}
	wg.Wait()
	<-sampled
	res.handoffs = handoffs.Load()
	sort.Slice(res.lat, func(i, j int) bool { return res.lat[i] < res.lat[j] })
	return res
}

// pairBlock is how many cycles a paired cell with one goroutine runs on
// one library before it moves to the next; a block's time is reported as
// the time of pairBlock cycles whatever the goroutines.
const pairBlock = 50

// pairTime is how long every goroutine of a paired cell with several runs
// one library before the cell moves to the next: long enough for
// thousands of cycles, short enough that the machine's drift is the same
// for the blocks of one pass.
const pairTime = 100 * time.Millisecond

// runPaired runs a paired scenario: each library on keys of its own, the
// cell cycling through the libraries a block at a time, for warmup
// unmeasured and then until every library has had duration of measured
// time. With one goroutine a block is pairBlock lock cycles; with several,
// every goroutine cycles for pairTime and the block ends when the last
// one's cycle does. A cycle's rate follows the machine's wake-up latency
// and whatever else runs on it, which drift over seconds; separate cells
// catch different stretches of that drift (their ratios move ±15% from
// round to round on a shared VM, and by half on a noisy one), the blocks
// of one pass (milliseconds apart at one goroutine, under a second at 16
// and 64) catch the same. The libraries' order is shuffled
// every pass, so that each follows every other equally often. Each
// library's result counts its own blocks: window is the time they took,
// and blocks holds each pass's as the time of pairBlock cycles. CPU is
// not sampled (the process runs them all).
func runPaired(libs []*library, goroutines int, keyBase func(*library) string, warmup, duration time.Duration) []*result {
	ctx, cancel := context.WithTimeout(context.Background(), warmup+time.Duration(len(libs))*duration+time.Minute)
	defer cancel()
	res := make([]*result, len(libs))
	ws := make([][]worker, len(libs))
	// lats holds each goroutine's latencies across its blocks, merged into
	// its library's result at the end: appending to a buffer of its own
	// grows it rarely, so the harness allocates next to nothing per cycle
	// inside the blocks whose allocations are counted.
	lats := make([][][]time.Duration, len(libs))
	for i, l := range libs {
		res[i] = &result{perG: make([]int64, goroutines), serverCPU: -1, benchCPU: -1, cmds: -1}
		lats[i] = make([][]time.Duration, goroutines)
		for g := range goroutines {
			key := keyBase(l)
			if goroutines > 1 {
				key = fmt.Sprintf("%s/g%d", key, g)
			}
			ws[i] = append(ws[i], l.newWorker(key))
			lats[i][g] = make([]time.Duration, 0, 1024)
		}
	}
	// run is one goroutine's part of a block of library i: pairBlock
	// cycles alone, else cycles until the block's end; it returns the
	// cycles that succeeded, the errors and the first of them.
	run := func(i, g int, until time.Time, measured bool) (n, errs int64, first error) {
		w := ws[i][g]
		for c := 0; ; c++ {
			if goroutines == 1 && c == pairBlock || goroutines > 1 && !time.Now().Before(until) || ctx.Err() != nil {
				return n, errs, first
			}
			start := time.Now()
			ok, err := w.try(ctx)
			if err == nil && !ok {
				err = errors.New("try: not acquired on a key of its own")
			}
			if err == nil {
				if err = w.unlock(ctx); err != nil {
					err = fmt.Errorf("unlock: %w", err)
				}
			}
			if err != nil {
				errs++
				if first == nil {
					first = err
				}
				time.Sleep(time.Millisecond) // no hot loop on a broken server
				continue
			}
			n++
			if measured {
				lats[i][g] = append(lats[i][g], time.Since(start))
			}
		}
	}
	block := func(i int, measured bool) {
		r := res[i]
		var m0 uint64
		if measured {
			m0 = mallocs()
		}
		var (
			mu     sync.Mutex // guards what the goroutines add up below
			cycles int64
			errs   int64
			first  error
		)
		add := func(g int, n, e int64, err error) {
			mu.Lock()
			defer mu.Unlock()
			cycles += n
			errs += e
			if first == nil {
				first = err
			}
			if measured {
				r.perG[g] += n
			}
		}
		begin := time.Now()
		if goroutines == 1 { // inline: no goroutine's start in the block's time
			n, e, err := run(i, 0, time.Time{}, measured)
			add(0, n, e, err)
		} else {
			until := begin.Add(pairTime)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, e, err := run(i, g, until, measured)
					add(g, n, e, err)
				}()
			}
			wg.Wait()
		}
		took := time.Since(begin)
		if !measured {
			return
		}
		r.allocs += int64(mallocs() - m0)
		r.window += took
		r.cycles += cycles
		r.attempts += cycles
		r.errs += errs
		if r.firstErr == nil {
			r.firstErr = first
		}
		if errs == 0 && cycles > 0 {
			r.blocks[len(r.blocks)-1] = time.Duration(float64(took) * pairBlock / float64(cycles))
		}
	}
	for t0 := time.Now(); time.Since(t0) < warmup && ctx.Err() == nil; {
		for i := range libs {
			block(i, false)
		}
	}
	for ctx.Err() == nil {
		done := true
		for _, r := range res {
			r.blocks = append(r.blocks, 0)
		}
		// A fresh order every pass: a block runs a little faster or slower
		// after some libraries than after others (one that leaves
		// goroutines of its own running keeps the other vCPU awake for the
		// next), and a fixed cycle would give each library the same
		// predecessor in every pass.
		for _, i := range mrand.Perm(len(libs)) {
			if res[i].window < duration {
				block(i, true)
				done = false
			}
		}
		if done {
			break
		}
	}
	for i, r := range res {
		for _, l := range lats[i] {
			r.lat = append(r.lat, l...)
		}
		sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
	}
	return res
}
