package memlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/leakcheck"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/memlock"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	locktest.Run(t, func(*testing.T) lock.Backend { return &memlock.Backend{} })
}

// Memory stays bounded: released keys leave no entry, and keys whose
// holders never released (crashed) are swept after they expire.
func TestBounded(t *testing.T) {
	b := &memlock.Backend{}
	l := lock.New(b, nil)
	ctx := context.Background()
	for i := range 5000 {
		lease, err := l.TryAcquire(ctx, fmt.Sprintf("k%d", i), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.Len(); n != 0 {
		t.Errorf("after 5000 released keys Len = %d; want 0", n)
	}
	for i := range 3000 { // abandoned: never released
		if _, err := l.TryAcquire(ctx, fmt.Sprintf("a%d", i), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond)
	for i := range 2048 { // more acquires trigger sweeps
		lease, _ := l.TryAcquire(ctx, fmt.Sprintf("s%d", i), time.Minute)
		_ = lease.Release(ctx)
	}
	if n := b.Len(); n > 1024 {
		t.Errorf("after 3000 abandoned, expired keys and two sweeps Len = %d; want them swept (at most one sweep interval of new ones)", n)
	}
}
