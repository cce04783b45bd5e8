package psp_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

func TestSameKeySameResult(t *testing.T) {
	var s psp.Sim
	ctx := context.Background()
	var wg sync.WaitGroup
	ids := make(chan string, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op, err := s.Do(ctx, psp.Payout, "wd_1", 1000)
			if err != nil {
				t.Errorf("Do = %v", err)
				return
			}
			ids <- op.ID
		}()
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Errorf("operation ids %s and %s for one key; want one", first, id)
		}
	}
	if n, total := s.Moved(psp.Payout); n != 1 || total != 1000 {
		t.Errorf("Moved = %d, %v; want 1, 10.00", n, total)
	}
	if _, err := s.Do(ctx, psp.Payout, "wd_1", 999); !errors.Is(err, psp.ErrKeyReused) {
		t.Errorf("same key, other amount = %v; want ErrKeyReused", err)
	}
	if _, err := s.Do(ctx, psp.Charge, "wd_1", 1000); !errors.Is(err, psp.ErrKeyReused) {
		t.Errorf("same key, other kind = %v; want ErrKeyReused", err)
	}
}

func TestFaults(t *testing.T) {
	var s psp.Sim
	ctx := context.Background()
	s.Inject(psp.TimeoutAfterCommit, psp.TimeoutBeforeCommit, psp.Decline)

	// Money moved, but the caller cannot know: it asks, and retrying with
	// the same key does not pay again.
	if _, err := s.Do(ctx, psp.Payout, "a", 500); !errors.Is(err, psp.ErrUnknownOutcome) {
		t.Fatalf("Do = %v; want ErrUnknownOutcome", err)
	}
	if op, err := s.Lookup(ctx, "a"); err != nil || op.Status != psp.Succeeded {
		t.Errorf("Lookup after a timeout after commit = %+v, %v; want succeeded", op, err)
	}
	if op, err := s.Do(ctx, psp.Payout, "a", 500); err != nil || op.Status != psp.Succeeded {
		t.Errorf("retry with the same key = %+v, %v", op, err)
	}
	if n, _ := s.Moved(psp.Payout); n != 1 {
		t.Errorf("payouts moved = %d; want 1", n)
	}

	// Nothing moved: Lookup says so, a retry with the same key pays once.
	if _, err := s.Do(ctx, psp.Payout, "b", 500); !errors.Is(err, psp.ErrUnknownOutcome) {
		t.Fatalf("Do = %v; want ErrUnknownOutcome", err)
	}
	if _, err := s.Lookup(ctx, "b"); !errors.Is(err, psp.ErrNotFound) {
		t.Errorf("Lookup after a timeout before commit = %v; want ErrNotFound", err)
	}

	// A definite failure is recorded and replayed for its key.
	op, err := s.Do(ctx, psp.Payout, "c", 500)
	if err != nil || op.Status != psp.Failed {
		t.Fatalf("declined = %+v, %v; want failed", op, err)
	}
	if again, _ := s.Do(ctx, psp.Payout, "c", 500); again.Status != psp.Failed {
		t.Errorf("retry of a declined key = %v; want the same failure", again.Status)
	}
	if n, total := s.Moved(psp.Payout); n != 1 || total != 500 {
		t.Errorf("Moved = %d, %v; want 1, 5.00", n, total)
	}
}

func TestInvalid(t *testing.T) {
	var s psp.Sim
	for _, tc := range []struct {
		kind   psp.Kind
		key    string
		amount int64
	}{{psp.Payout, "", 1}, {psp.Payout, "k", 0}, {psp.Payout, "k", -1}, {"refund", "k", 1}, {psp.Payout, strings.Repeat("k", 256), 1}} {
		if _, err := s.Do(context.Background(), tc.kind, tc.key, money.Amount(tc.amount)); !errors.Is(err, psp.ErrInvalid) {
			t.Errorf("Do(%v, %q, %d) = %v; want ErrInvalid", tc.kind, tc.key, tc.amount, err)
		}
	}
}
