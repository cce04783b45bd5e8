package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pairedBest holds each onceguard backend to the minimal design it
// compares worst with, and judges the best of those pairs: og-a is 2×
// min-x but 0.88× min-y (its worst), og-b 2.5× min-x and 1.1× min-y (its
// worst, the best of the worsts; every pass alike): og-b / min-y at 1.1×,
// PASS at ≥ 1, neither og-b's best pair nor the first backend's.
func TestPairedBestPicksTheBindingPair(t *testing.T) {
	blocks := func(xs ...float64) *result {
		r := &result{window: time.Second, cycles: 1}
		for _, x := range xs {
			r.blocks = append(r.blocks, time.Duration(x*float64(time.Millisecond)))
		}
		return r
	}
	rep := &report{cells: map[string][]*result{
		"og-a/paired-16":  {blocks(5, 5, 5)},
		"og-b/paired-16":  {blocks(4, 4, 4)},
		"min-x/paired-16": {blocks(10, 10, 10)},
		"min-y/paired-16": {blocks(4.4, 4.4, 4.4)},
	}}
	var b strings.Builder
	pairedBest(&b, rep, "x", "paired-16", []string{"og-a", "og-b"}, []string{"min-x", "min-y"}, 1)
	got := b.String()
	if !strings.Contains(got, "1.100×") || !strings.Contains(got, "og-b / min-y") || !strings.Contains(got, "PASS") {
		t.Fatalf("pairedBest = %q; want og-b / min-y at 1.100×, PASS", got)
	}

	// The same at a target of 1.2: the whole interval (a point) is below.
	b.Reset()
	pairedBest(&b, rep, "x", "paired-16", []string{"og-a", "og-b"}, []string{"min-x", "min-y"}, 1.2)
	if got := b.String(); !strings.Contains(got, "FAIL") {
		t.Fatalf("pairedBest at 1.2× = %q; want FAIL", got)
	}

	// Every pair's interval counts, not only the closest pair's: og-a is
	// 1.05× min-x in every pass (a point above 1), and 0.7× or 1.6× min-w
	// in alternate passes, a mean above 1.05 whose interval spans 1: TIE.
	wide := &report{cells: map[string][]*result{
		"og-a/paired-16":  {blocks(10, 10, 10, 10, 10, 10)},
		"min-x/paired-16": {blocks(10.5, 10.5, 10.5, 10.5, 10.5, 10.5)},
		"min-w/paired-16": {blocks(7, 16, 7, 16, 7, 16)},
	}}
	b.Reset()
	pairedBest(&b, wide, "x", "paired-16", []string{"og-a"}, []string{"min-x", "min-w"}, 1)
	if got := b.String(); !strings.Contains(got, "TIE") || !strings.Contains(got, "og-a / min-x") {
		t.Fatalf("pairedBest with a wide pair = %q; want og-a / min-x shown and TIE", got)
	}
	// FAIL needs every backend below: og-a is 0.95× min-x (a point below
	// 1), og-b 0.7× or 1.3× of it in alternate passes (spans 1): TIE.
	split := &report{cells: map[string][]*result{
		"og-a/paired-16":  {blocks(10, 10, 10, 10, 10, 10)},
		"og-b/paired-16":  {blocks(13.57, 7.31, 13.57, 7.31, 13.57, 7.31)},
		"min-x/paired-16": {blocks(9.5, 9.5, 9.5, 9.5, 9.5, 9.5)},
	}}
	b.Reset()
	pairedBest(&b, split, "x", "paired-16", []string{"og-a", "og-b"}, []string{"min-x"}, 1)
	if got := b.String(); !strings.Contains(got, "TIE") {
		t.Fatalf("pairedBest with one backend below and one spanning = %q; want TIE", got)
	}
	b.Reset()
	pairedBest(&b, split, "x", "paired-16", []string{"og-a"}, []string{"min-x"}, 1)
	if got := b.String(); !strings.Contains(got, "FAIL") {
		t.Fatalf("pairedBest with og-a alone below = %q; want FAIL", got)
	}

	b.Reset()
	pairedBest(&b, rep, "x", "paired-64", []string{"og-a"}, []string{"min-x"}, 1)
	if got := b.String(); !strings.Contains(got, "not run") {
		t.Fatalf("pairedBest without cells = %q; want not run", got)
	}
}

// fakeLock is an in-process lock of the bench's worker shape whose cycle
// takes a fixed time, with a count of the goroutines inside a cycle.
type fakeLock struct {
	cycle    time.Duration
	inside   *atomic.Int64
	maxInFly *atomic.Int64
	mu       sync.Mutex
	held     map[string]bool
}

type fakeWorker struct {
	l   *fakeLock
	key string
}

func (w *fakeWorker) try(ctx context.Context) (bool, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	if w.l.held[w.key] {
		return false, nil
	}
	w.l.held[w.key] = true
	return true, nil
}

func (w *fakeWorker) block(ctx context.Context) error { _, err := w.try(ctx); return err }

func (w *fakeWorker) unlock(ctx context.Context) error {
	n := w.l.inside.Add(1)
	for {
		m := w.l.maxInFly.Load()
		if n <= m || w.l.maxInFly.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(w.l.cycle)
	w.l.inside.Add(-1)
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	delete(w.l.held, w.key)
	return nil
}

func fakeLibrary(name string, cycle time.Duration) (*library, *atomic.Int64) {
	l := &fakeLock{cycle: cycle, inside: new(atomic.Int64), maxInFly: new(atomic.Int64), held: map[string]bool{}}
	return &library{name: name, group: groupRedis, newWorker: func(key string) worker { return &fakeWorker{l: l, key: key} }}, l.maxInFly
}

// runPaired with several goroutines runs them all on one library at a
// time, each on a key of its own (a shared key would make try fail), and
// records every pass's block as the time of pairBlock cycles: a library
// whose cycle takes twice as long gets blocks about twice as long, and
// the pairs' ratio says so.
func TestRunPairedGoroutines(t *testing.T) {
	// Cycles of 5 and 10 ms: a timer's slack of a millisecond or two on a
	// loaded machine leaves their ratio well inside the band checked.
	fast, fastMax := fakeLibrary("fast", 5*time.Millisecond)
	slow, slowMax := fakeLibrary("slow", 10*time.Millisecond)
	rs := runPaired([]*library{fast, slow}, 4, func(l *library) string { return "k/" + l.name }, 50*time.Millisecond, 500*time.Millisecond)
	for i, r := range rs {
		if r.errs != 0 {
			t.Fatalf("library %d: %d errors, the first %v", i, r.errs, r.firstErr)
		}
		if r.window < 500*time.Millisecond || r.cycles == 0 || len(r.blocks) < 5 {
			t.Fatalf("library %d: window %v, %d cycles, %d blocks; want at least 500ms of blocks", i, r.window, r.cycles, len(r.blocks))
		}
		for g, n := range r.perG {
			if n == 0 {
				t.Fatalf("library %d: goroutine %d ran no cycle", i, g)
			}
		}
	}
	if fastMax.Load() != 4 || slowMax.Load() != 4 {
		t.Fatalf("cycles in flight at once: %d and %d; want the 4 goroutines each", fastMax.Load(), slowMax.Load())
	}
	geo, lo, hi, n := pairedRatio(rs[:1], rs[1:])
	if n < 5 || geo < 1.5 || geo > 2.5 || lo > geo || hi < geo {
		t.Fatalf("fast / slow by paired blocks: %.3f (%.3f–%.3f) over %d pairs; want about 2", geo, lo, hi, n)
	}
}

// flakyLock is fakeLock whose every nth unlock fails.
type flakyWorker struct {
	fakeWorker
	n, every *atomic.Int64
}

func (w *flakyWorker) unlock(ctx context.Context) error {
	if err := w.fakeWorker.unlock(ctx); err != nil {
		return err
	}
	if w.n.Add(1)%w.every.Load() == 0 {
		return errors.New("flaky: unlock failed")
	}
	return nil
}

// With one goroutine a block is exactly pairBlock cycles, run inline;
// cycles add up per goroutine; a block with a failed cycle is not paired
// (its time stays 0) while its errors are counted.
func TestRunPairedOneGoroutine(t *testing.T) {
	// Cycles without a sleep: hundreds of blocks in the measured time,
	// however coarse the machine's timers.
	fast, _ := fakeLibrary("fast", 0)
	l := &fakeLock{inside: new(atomic.Int64), maxInFly: new(atomic.Int64), held: map[string]bool{}}
	every := new(atomic.Int64)
	every.Store(170) // a failure every 3.4 blocks of 50
	n := new(atomic.Int64)
	flaky := &library{name: "flaky", group: groupRedis, newWorker: func(key string) worker {
		return &flakyWorker{fakeWorker: fakeWorker{l: l, key: key}, n: n, every: every}
	}}
	rs := runPaired([]*library{fast, flaky}, 1, func(l *library) string { return "k/" + l.name }, 5*time.Millisecond, 50*time.Millisecond)
	r := rs[0]
	if r.errs != 0 || len(r.blocks) < 5 {
		t.Fatalf("fast: %d errors, %d blocks", r.errs, len(r.blocks))
	}
	paired := 0
	for _, b := range r.blocks {
		if b > 0 {
			paired++
		}
	}
	if r.cycles != int64(paired)*pairBlock || r.perG[0] != r.cycles {
		t.Fatalf("fast: %d cycles, %d on its goroutine, %d blocks; want %d cycles per block", r.cycles, r.perG[0], paired, pairBlock)
	}
	f := rs[1]
	if f.errs == 0 || f.firstErr == nil {
		t.Fatalf("flaky: %d errors recorded; want its failed unlocks", f.errs)
	}
	// Every measured block made pairBlock attempts, and with a failure
	// every 170th cycle at most one of them failed: the blocks run are
	// (cycles + errors) / pairBlock, and all but the failed ones paired.
	counted := 0
	for _, b := range f.blocks {
		if b > 0 {
			counted++
		}
	}
	attempts := f.cycles + f.errs
	if attempts%pairBlock != 0 || int64(counted) != attempts/pairBlock-f.errs {
		t.Fatalf("flaky: %d cycles and %d errors, %d blocks paired; want %d of its %d blocks, those without a failure", f.cycles, f.errs, counted, attempts/pairBlock-f.errs, attempts/pairBlock)
	}
	var sum int64
	for _, x := range f.perG {
		sum += x
	}
	if sum != f.cycles {
		t.Fatalf("flaky: %d cycles, %d over its goroutines", f.cycles, sum)
	}
}
