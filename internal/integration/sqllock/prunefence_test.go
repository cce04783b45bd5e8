package sqllock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// TestFenceAboveStored's case (a row whose fence is ahead of the clock: a
// clock that stepped back), once the row has been idle past Retention: the
// cleanup must not prune a row whose fence the clock has not passed, or
// the next acquire restarts from the clock, below fences already granted.
func TestPruneKeepsFenceAheadOfClock(t *testing.T) {
	for _, d := range databases[:3] {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			table := fmt.Sprintf("og_prune_%d", time.Now().UnixNano()%1_000_000_000)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
			b, err := sqllock.New(db, d.dialect, &sqllock.Options{Table: table, Retention: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := b.Acquire(ctx, lock.Request{Key: "k", Owner: "a", TTL: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			_ = b.Release(ctx, "k", "a")
			ahead := time.Now().Add(24*time.Hour).UnixMicro() + 1_000_000 // granted before the clock stepped back a day
			q := "UPDATE " + table + " SET fence = ? WHERE name = ?"
			if d.dialect == sqldialect.Postgres {
				q = "UPDATE " + table + " SET fence = $1 WHERE name = $2"
			}
			if _, err := db.ExecContext(ctx, q, ahead, []byte("k")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // idle past Retention
			for i := range 300 {              // acquires on other keys run a cleanup
				key := fmt.Sprintf("other-%d", i)
				if _, err := b.Acquire(ctx, lock.Request{Key: key, Owner: "o", TTL: time.Minute}); err == nil {
					_ = b.Release(ctx, key, "o")
				}
			}
			g, err := b.Acquire(ctx, lock.Request{Key: "k", Owner: "b", TTL: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if g.Fence <= ahead {
				t.Errorf("fence %d after a pruned row's %d; want above it (fences must only go up per key)", g.Fence, ahead)
			}
		})
	}
}
