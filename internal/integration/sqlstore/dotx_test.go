package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// DoTx commits fn's effect and its record together: a delivery whose fn
// fails, or whose lease was taken over before it stored its result, leaves
// no effect; the one that stores its result leaves exactly one, and later
// deliveries replay it.
func TestDoTx(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db := d.store(t)
			ctx := context.Background()
			table := fmt.Sprintf("dotx_%d", time.Now().UnixNano())
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (msg VARCHAR(64))`); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
			insert := `INSERT INTO ` + table + ` (msg) VALUES ('m1')`
			effects := func() (n int) {
				t.Helper()
				if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			scope := idempotency.Scope{Principal: t.Name(), Method: "invoice.send"}
			key := fmt.Sprint("m1-", time.Now().UnixNano())

			// fn fails after its write: rolled back, the key freed.
			boom := errors.New("boom")
			if _, _, err := s.DoTx(ctx, scope, key, "v1", nil, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				if _, err := tx.ExecContext(ctx, insert); err != nil {
					return nil, err
				}
				return nil, boom
			}); !errors.Is(err, boom) || effects() != 0 {
				t.Fatalf("DoTx with fn failing = %v, %d effects; want fn's error, none", err, effects())
			}

			// The lease runs out while fn works and another delivery takes
			// the key over: the slow one's result cannot be stored, and its
			// write is rolled back with it.
			now := time.Now()
			var slowErr error
			_, _, slowErr = s.DoTx(ctx, scope, key, "v1", &idempotency.DoOptions{Lease: time.Minute, Now: func() time.Time { return now }}, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				// Meanwhile, two minutes on, a redelivery takes the key over
				// (before this transaction writes: SQLite has one writer).
				later := now.Add(2 * time.Minute)
				res, err := s.Begin(context.Background(), idemstore.BeginRequest{ID: idempotency.RecordID(scope, key), Fingerprint: "v1", Lease: time.Minute, TTL: time.Hour, Now: later})
				if err != nil || !res.Recovered {
					return nil, fmt.Errorf("take-over = %+v, %v", res, err)
				}
				if err := s.Abandon(context.Background(), idempotency.RecordID(scope, key), res.Lease); err != nil {
					return nil, err
				}
				if _, err := tx.ExecContext(ctx, insert); err != nil {
					return nil, err
				}
				return []byte("slow"), nil
			})
			if !errors.Is(slowErr, idempotency.ErrLeaseLost) || effects() != 0 {
				t.Fatalf("DoTx whose lease was taken over = %v, %d effects; want ErrLeaseLost, none", slowErr, effects())
			}

			// A delivery that stores its result: one effect, then replays.
			for i, want := range []bool{false, true, true} {
				res, replayed, err := s.DoTx(ctx, scope, key, "v1", nil, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
					if _, err := tx.ExecContext(ctx, insert); err != nil {
						return nil, err
					}
					return []byte("sent"), nil
				})
				if err != nil || replayed != want || string(res) != "sent" {
					t.Errorf("delivery %d = %q, %v, %v; want sent, replayed %v", i+1, res, replayed, err, want)
				}
			}
			if n := effects(); n != 1 {
				t.Errorf("effects = %d; want 1", n)
			}
		})
	}
}

// CompleteTx on a caller's transaction completes nothing once the lease
// is lost (a take-over): ErrLeaseLost, so the caller's business change in
// that transaction rolls back with it; the current lease completes it.
func TestCompleteTxLostLease(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db := d.store(t)
			ctx, now := context.Background(), time.Now()
			id := idempotency.RecordID(idempotency.Scope{Principal: t.Name()}, now.String())
			first, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			second, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now.Add(2 * time.Minute)})
			if err != nil || !second.Recovered {
				t.Fatalf("take-over = %+v, %v", second, err)
			}
			for _, c := range []struct {
				name, lease string
				want        error
			}{{"lost", first.Lease, idempotency.ErrLeaseLost}, {"current", second.Lease, nil}} {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				err = s.CompleteTx(ctx, tx, id, c.lease, idemstore.Response{Status: 201, Body: []byte("x")})
				if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
					t.Errorf("CompleteTx with the %s lease = %v; want %v", c.name, err, c.want)
				}
				if err != nil {
					_ = tx.Rollback()
				} else if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
