package app

import (
	"context"
	"sync"
	"testing"
	"time"
)

// At most cap(hashSlots) password hashes run at once (each holds 19 MiB);
// the next waits for a slot, and one whose request ends while it waits is
// refused busy (503, Retry-After 1) without hashing.
func TestHashingBounded(t *testing.T) {
	s := &Service{hashSlots: make(chan struct{}, 2)}
	release := make(chan struct{})
	var running sync.WaitGroup
	running.Add(2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.hashing(context.Background(), func() { running.Done(); <-release })
		}()
	}
	running.Wait() // both slots taken
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ran := false
	if err := s.hashing(ctx, func() { ran = true }); err == nil || ran {
		t.Error("a third hash ran while two held both slots")
	} else if ErrorCode(err) != CodeBusy {
		t.Errorf("third, its request ended while waiting = %v; want code busy (503, Retry-After 1)", err)
	}
	close(release)
	wg.Wait()
	if err := s.hashing(context.Background(), func() { ran = true }); err != nil || !ran {
		t.Error("with the slots free again, a hash did not run")
	}
}
