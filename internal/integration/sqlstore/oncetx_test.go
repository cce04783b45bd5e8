package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// OnceTx records the event in fn's transaction: a failed fn leaves no
// effect and no record; a crashed delivery (its transaction rolled back
// with the connection, its record left in flight) is taken over after its
// lease; 20 concurrent duplicates, each retrying while told "in progress",
// make the effect once.
func TestOnceTx(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db := d.store(t)
			ctx := context.Background()
			table := fmt.Sprintf("oncetx_%d", time.Now().UnixNano())
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (event VARCHAR(64))`); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
			effects := func(event string) (n int) {
				t.Helper()
				if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+` WHERE event = '`+event+`'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			apply := func(event string) func(ctx context.Context, tx *sql.Tx) error {
				return func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (event) VALUES ('`+event+`')`)
					return err
				}
			}
			src := fmt.Sprint(t.Name(), "/", time.Now().UnixNano())

			t.Run("FailureRollsBack", func(t *testing.T) {
				boom := errors.New("boom")
				ran, err := s.OnceTx(ctx, src, "evt_fail", nil, func(ctx context.Context, tx *sql.Tx) error {
					if err := apply("evt_fail")(ctx, tx); err != nil {
						return err
					}
					return boom
				})
				if !errors.Is(err, boom) || ran || effects("evt_fail") != 0 {
					t.Fatalf("OnceTx with fn failing after its write = %v, %v, %d effects; want fn's error, none", ran, err, effects("evt_fail"))
				}
				for i, want := range []bool{true, false, false} {
					ran, err := s.OnceTx(ctx, src, "evt_fail", nil, apply("evt_fail"))
					if err != nil || ran != want {
						t.Fatalf("delivery %d = %v, %v; want ran %v", i+1, ran, err, want)
					}
				}
				if n := effects("evt_fail"); n != 1 {
					t.Errorf("effects = %d; want 1", n)
				}
				if ran, err := s.OnceTx(ctx, "", "evt_fail", nil, apply("evt_fail")); !errors.Is(err, idempotency.ErrKeyMissing) || ran {
					t.Errorf("OnceTx without a source = %v, %v; want ErrKeyMissing", ran, err)
				}
			})

			t.Run("CrashedDelivery", func(t *testing.T) {
				// The crashed delivery: its Begin committed, its effect's
				// transaction died with the process (rolled back).
				now := time.Now()
				id := idempotency.RecordID(idempotency.OnceScope(src), "evt_crash")
				if res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Lease: time.Minute, TTL: time.Hour, Now: now}); err != nil || res.Outcome != idemstore.Started {
					t.Fatalf("Begin = %+v, %v", res, err)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := apply("evt_crash")(ctx, tx); err != nil {
					t.Fatal(err)
				}
				_ = tx.Rollback()
				at := func(d time.Duration) *idempotency.DoOptions {
					return &idempotency.DoOptions{Lease: time.Minute, Now: func() time.Time { return now.Add(d) }}
				}
				if ran, err := s.OnceTx(ctx, src, "evt_crash", at(10*time.Second), apply("evt_crash")); !errors.Is(err, idempotency.ErrInProgress) || ran {
					t.Fatalf("redelivery inside the crashed one's lease = %v, %v; want ErrInProgress", ran, err)
				}
				for i, want := range []bool{true, false} {
					if ran, err := s.OnceTx(ctx, src, "evt_crash", at(2*time.Minute), apply("evt_crash")); err != nil || ran != want {
						t.Fatalf("redelivery %d after the lease = %v, %v; want ran %v", i+1, ran, err, want)
					}
				}
				if n := effects("evt_crash"); n != 1 {
					t.Errorf("effects = %d; want 1", n)
				}
			})

			t.Run("ConcurrentDuplicates", func(t *testing.T) {
				const n = 20
				var (
					wg    sync.WaitGroup
					start = make(chan struct{})
					rans  = make([]bool, n)
					errs  = make([]error, n)
				)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						for attempt := 0; ; attempt++ {
							rans[i], errs[i] = s.OnceTx(ctx, src, "evt_storm", nil, apply("evt_storm"))
							if !errors.Is(errs[i], idempotency.ErrInProgress) || attempt == 2000 {
								return
							}
							time.Sleep(5 * time.Millisecond) // a redelivery's backoff
						}
					}()
				}
				close(start)
				wg.Wait()
				ran := 0
				for i := range n {
					if errs[i] != nil {
						t.Errorf("delivery %d = %v", i, errs[i])
					}
					if rans[i] {
						ran++
					}
				}
				if got := effects("evt_storm"); ran != 1 || got != 1 {
					t.Errorf("%d deliveries ran fn, %d effects; want 1, 1", ran, got)
				}
			})
		})
	}
}
