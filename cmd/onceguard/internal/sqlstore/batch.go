package sqlstore

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxBatch bounds the requests one batch statement carries.
	maxBatch = 64
	// batchRunners is how many batches of a kind run at once: one runs while the next gathers,
	// and a deep queue does not wait behind a whole batch.
	batchRunners = 2
	// batchSpill is how many requests must be queued for another runner to start while one
	// runs: fewer wait for the running batch and go in the next, in fewer and larger
	// statements.
	batchSpill = 8
	// batchTimeout bounds a batch none of whose requests has a deadline.
	batchTimeout = 10 * time.Second
	// batchYields is how many times a runner yields its processor (runtime.Gosched) before it
	// takes a batch off the queue: requests that are due are often runnable but not running
	// (on two cores the handlers, PostgreSQL and the clients wait for one), as sqldb.WriteGate
	// found for its groups; a yield costs nothing when nothing else is runnable.
	batchYields = 2
)

// batcher gathers the concurrent requests of one kind (settlements, debits) into batches, each
// run as one statement; its zero value is ready. No goroutine outlives the queue: runners
// start with a request and end once it is empty.
type batcher[I any] struct {
	mu       sync.Mutex
	queue    []I
	inflight map[string]bool // the keys of the running batches' requests
	running  int

	hold func() // tests: called before each batch runs

	batches, items atomic.Int64 // batches committed, requests they carried
}

// batchKeys names what one request changes: no two requests with a key in common are in
// running batches at once ("" is no key).
type batchKeys [2]string

// add queues it and starts a runner, which runs batches with runBatch, when none runs, or
// when fewer than batchRunners run and batchSpill requests are queued.
func (b *batcher[I]) add(it I, keys func(I) batchKeys, runBatch func([]I)) {
	b.mu.Lock()
	b.queue = append(b.queue, it)
	start := b.running == 0 || (b.running < batchRunners && len(b.queue) >= batchSpill)
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		go b.run(keys, runBatch)
	}
}

// run takes batches off the queue and runs them until it is empty.
func (b *batcher[I]) run(keys func(I) batchKeys, runBatch func([]I)) {
	for {
		for range batchYields {
			runtime.Gosched()
		}
		batch := b.next(keys)
		if len(batch) == 0 {
			return
		}
		if b.hold != nil {
			b.hold()
		}
		runBatch(batch)
		b.mu.Lock()
		for _, it := range batch {
			for _, k := range keys(it) {
				delete(b.inflight, k)
			}
		}
		b.mu.Unlock()
	}
}

// next takes the next batch off the queue: at most maxBatch requests, none with a key of
// another in it or in a running batch (one statement would change a row twice; one in a
// running batch waits for its end). An empty batch ends the runner.
func (b *batcher[I]) next(keys func(I) batchKeys) []I {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight == nil {
		b.inflight = make(map[string]bool)
	}
	var batch []I
	rest := b.queue[:0]
	for _, it := range b.queue {
		ks := keys(it)
		if len(batch) == maxBatch || b.inflight[ks[0]] || b.inflight[ks[1]] {
			rest = append(rest, it)
			continue
		}
		for _, k := range ks {
			if k != "" {
				b.inflight[k] = true
			}
		}
		batch = append(batch, it)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	if len(batch) == 0 {
		b.running--
	}
	return batch
}

// ran records a batch's statement, of n requests, started at start: its time under op (when
// observe is set), and, when it succeeded (err nil), the batch and its requests in b's counters.
func (b *batcher[I]) ran(observe func(op string, d time.Duration), op string, start time.Time, n int, err error) {
	if observe != nil {
		observe(op, time.Since(start))
	}
	if err == nil {
		b.batches.Add(1)
		b.items.Add(int64(n))
	}
}

// liveItems returns the requests of batch whose context has not ended, telling the others why
// (ended: they are never sent), and the latest of their deadlines (batchTimeout from now for
// one without): the batch statement's.
func liveItems[I any](batch []I, ctx func(I) context.Context, ended func(I, error)) (out []I, deadline time.Time) {
	out = make([]I, 0, len(batch))
	for _, it := range batch {
		c := ctx(it)
		if err := c.Err(); err != nil {
			ended(it, err)
			continue
		}
		d, ok := c.Deadline()
		if !ok {
			d = time.Now().Add(batchTimeout)
		}
		if d.After(deadline) {
			deadline = d
		}
		out = append(out, it)
	}
	return out, deadline
}
