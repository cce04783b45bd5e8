package sqllock_test

import (
	"context"
	"database/sql"
	"os"

	"errors"
	"fmt"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/sqldialect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/sqllock"
)

// Many clients on a few keys, rows pruned all the time: every answer is a
// grant or ErrNotAcquired (no deadlock, serialization or other error), one
// holder per key at a time, fences strictly increasing per key.
func TestStress(t *testing.T) {
	dbs := append([]database{}, databases[:3]...)
	dbs = append(dbs,
		database{"mysql-read-committed", sqldialect.MySQL, func(t *testing.T) *sql.DB {
			db, err := sql.Open("mysql", os.Getenv("ONCEGUARD_TEST_MYSQL")+"?tx_isolation=%27READ-COMMITTED%27")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			var iso string
			if err := db.QueryRow("SELECT @@tx_isolation").Scan(&iso); err != nil || iso != "READ-COMMITTED" {
				t.Fatalf("isolation %q, %v", iso, err)
			}
			return db
		}},
		database{"mysql-serializable", sqldialect.MySQL, func(t *testing.T) *sql.DB {
			db, err := sql.Open("mysql", os.Getenv("ONCEGUARD_TEST_MYSQL")+"?tx_isolation=%27SERIALIZABLE%27")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return db
		}},
		database{"postgres-serializable", sqldialect.Postgres, func(t *testing.T) *sql.DB {
			db := dbtest.OpenPostgres(t, os.Getenv("ONCEGUARD_TEST_POSTGRES")+"&default_transaction_isolation=serializable")
			var iso string
			if err := db.QueryRow("SHOW transaction_isolation").Scan(&iso); err != nil || iso != "serializable" {
				t.Fatalf("isolation %q, %v", iso, err)
			}
			return db
		}},
		database{"postgres-repeatable-read", sqldialect.Postgres, func(t *testing.T) *sql.DB {
			return dbtest.OpenPostgres(t, os.Getenv("ONCEGUARD_TEST_POSTGRES")+"&default_transaction_isolation=repeatable%20read")
		}},
	)
	for _, d := range dbs {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			table := fmt.Sprintf("og_stress_%d", time.Now().UnixNano()%1_000_000_000)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
			const keys = 4
			var held [keys]atomic.Int32
			var last [keys]atomic.Int64
			var grants, refused, other atomic.Int64
			var mu sync.Mutex
			var errs []string
			ctx := context.Background()
			deadline := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			for w := range 12 {
				b, _ := sqllock.New(db, d.dialect, &sqllock.Options{Table: table, Retention: time.Microsecond})
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(deadline); i++ {
						k := (w + i) % keys
						key := fmt.Sprintf("k%d", k)
						owner := fmt.Sprintf("o%d-%d", w, i)
						g, err := b.Acquire(ctx, lock.Request{Key: key, Owner: owner, TTL: 2 * time.Second})
						switch {
						case err == nil:
							grants.Add(1)
							if held[k].Add(1) != 1 {
								mu.Lock()
								errs = append(errs, fmt.Sprintf("two holders of %s", key))
								mu.Unlock()
							}
							if prev := last[k].Swap(g.Fence); g.Fence <= prev {
								mu.Lock()
								errs = append(errs, fmt.Sprintf("fence %d after %d on %s", g.Fence, prev, key))
								mu.Unlock()
							}
							held[k].Add(-1)
							if err := b.Release(ctx, key, owner); err != nil {
								mu.Lock()
								errs = append(errs, "release: "+err.Error())
								mu.Unlock()
							}
						case errors.Is(err, lock.ErrNotAcquired):
							refused.Add(1)
						default:
							other.Add(1)
							mu.Lock()
							errs = append(errs, "acquire: "+err.Error())
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("grants %d, refused %d, other %d", grants.Load(), refused.Load(), other.Load())
			for i, e := range errs {
				if i == 10 {
					break
				}
				t.Error(e)
			}
		})
	}
}
