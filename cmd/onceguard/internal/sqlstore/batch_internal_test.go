package sqlstore

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A request queued while a batch runs waits for it and goes in the next, unless batchSpill
// are queued: then a second runner takes them beside the first. Every request is in exactly
// one batch, and the runners end with the queue.
func TestBatcherSpill(t *testing.T) {
	var b batcher[int]
	release := make(chan struct{})
	var held atomic.Int32
	b.hold = func() {
		held.Add(1)
		<-release
	}
	var mu sync.Mutex
	var batches [][]int
	run := func(batch []int) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, slices.Clone(batch))
	}
	keys := func(i int) batchKeys { return batchKeys{strconv.Itoa(i), ""} }
	state := func() (queued, running int) {
		queued, _, running = b.state()
		return queued, running
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	b.add(0, keys, run)
	waitFor("the first runner's batch", func() bool { return held.Load() == 1 })
	for i := 1; i < batchSpill; i++ {
		b.add(i, keys, run)
	}
	time.Sleep(20 * time.Millisecond) // a runner started by mistake would take the queue now
	if queued, running := state(); queued != batchSpill-1 || running != 1 || held.Load() != 1 {
		t.Fatalf("%d queued behind the running batch: %d queued, %d runners, %d batches running; want %d, 1, 1",
			batchSpill-1, queued, running, held.Load(), batchSpill-1)
	}
	b.add(batchSpill, keys, run)
	waitFor("a second runner", func() bool { return held.Load() == 2 })
	if queued, running := state(); queued != 0 || running != 2 {
		t.Fatalf("after the %dth queued: %d queued, %d runners; want 0, 2", batchSpill, queued, running)
	}
	close(release)
	waitFor("the runners to end", func() bool { _, running := state(); return running == 0 })

	mu.Lock()
	defer mu.Unlock()
	want := [][]int{{0}, make([]int, 0, batchSpill)}
	for i := 1; i <= batchSpill; i++ {
		want[1] = append(want[1], i)
	}
	slices.SortFunc(batches, func(x, y []int) int { return len(x) - len(y) })
	if !slices.EqualFunc(batches, want, slices.Equal[[]int]) {
		t.Errorf("batches %v, want %v", batches, want)
	}
}
