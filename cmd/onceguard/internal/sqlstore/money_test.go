package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/sqldialect"
)

// withUser gives a test a migrated, empty database of d with one user,
// u1 "alice", and an empty account.
func withUser(t *testing.T, d database) (*sqlstore.Store, int64) {
	t.Helper()
	s, _, now := withUserDB(t, d)
	return s, now
}

// withUserDB is withUser, with the store's database handle.
func withUserDB(t *testing.T, d database) (*sqlstore.Store, *sql.DB, int64) {
	t.Helper()
	db := d.open(t)
	fresh(t, db)
	if err := sqlstore.Migrate(context.Background(), db, d.dialect); err != nil {
		t.Fatal(err)
	}
	s := sqlstore.Open(db, d.dialect)
	now := time.Now().UnixMicro()
	if err := s.CreateUser(context.Background(), app.User{ID: "u1", Username: "alice", PasswordHash: "h", CreatedAt: time.UnixMicro(now)}, "CNY"); err != nil {
		t.Fatal(err)
	}
	return s, db, now
}

// withFunds is withUserDB with u1's account credited 100.00 (deposit d1, settled).
func withFunds(t *testing.T, d database) (*sqlstore.Store, *sql.DB, int64) {
	t.Helper()
	s, db, now := withUserDB(t, d)
	ctx := context.Background()
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 10000, CreatedAt: time.UnixMicro(now)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SettleDeposit(ctx, "d1", true, time.UnixMicro(now)); err != nil {
		t.Fatal(err)
	}
	return s, db, now
}

// Money moves exactly once and never below zero, whatever races: 30
// withdrawals of 10.00 against 100.00 succeed ten times; the same key
// twice debits once; settling twice credits or refunds once; the ledger
// always sums to the balance.
func TestMoney(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, now := withUser(t, d)
			ctx := context.Background()
			if err := s.CreateUser(ctx, app.User{ID: "u2", Username: "alice", PasswordHash: "h", CreatedAt: time.UnixMicro(now)}, "CNY"); !errors.Is(err, app.ErrUsernameTaken) {
				t.Errorf("CreateUser(taken) = %v; want ErrUsernameTaken", err)
			}
			if u, err := s.UserByName(ctx, "alice"); err != nil || u.ID != "u1" || u.PasswordHash != "h" {
				t.Errorf("UserByName = %+v, %v", u, err)
			}
			if _, err := s.UserByName(ctx, "bob"); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("UserByName(unknown) = %v; want ErrNotFound", err)
			}
			if err := s.CreateSession(ctx, "th", "u1", time.UnixMicro(now+1000), time.UnixMicro(now)); err != nil {
				t.Fatal(err)
			}
			if u, err := s.SessionUser(ctx, "th", time.UnixMicro(now)); err != nil || u.ID != "u1" {
				t.Errorf("SessionUser = %+v, %v", u, err)
			}
			if _, err := s.SessionUser(ctx, "th", time.UnixMicro(now+1000)); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("SessionUser(expired) = %v; want ErrNotFound", err)
			}
			if err := s.SessionLive(ctx, "th", time.UnixMicro(now)); err != nil {
				t.Errorf("SessionLive = %v", err)
			}
			for name, err := range map[string]error{
				"expired": s.SessionLive(ctx, "th", time.UnixMicro(now+1000)),
				"unknown": s.SessionLive(ctx, "other", time.UnixMicro(now)),
			} {
				if !errors.Is(err, app.ErrNotFound) {
					t.Errorf("SessionLive(%s) = %v; want ErrNotFound", name, err)
				}
			}
			if err := s.DeleteSession(ctx, "th"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.SessionUser(ctx, "th", time.UnixMicro(now)); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("SessionUser(after logout) = %v; want ErrNotFound", err)
			}
			if err := s.SessionLive(ctx, "th", time.UnixMicro(now)); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("SessionLive(after logout) = %v; want ErrNotFound", err)
			}
			dep, created, err := s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 10000, CreatedAt: time.UnixMicro(now)})
			if err != nil || !created {
				t.Fatalf("CreateDeposit = %+v, %v, %v", dep, created, err)
			}
			if again, created, err := s.CreateDeposit(ctx, app.Movement{ID: "d2", UserID: "u1", Key: "kd", Amount: 10000, CreatedAt: time.UnixMicro(now)}); err != nil || created || again.ID != "d1" {
				t.Errorf("CreateDeposit(same key) = %+v, %v, %v; want d1, not created", again, created, err)
			}
			for i := range 2 { // settling twice credits once, and only the first moves it
				if moved, err := s.SettleDeposit(ctx, "d1", true, time.UnixMicro(now)); err != nil || moved != (i == 0) {
					t.Fatalf("SettleDeposit #%d = %v, %v; want moved only the first time", i+1, moved, err)
				}
			}

			var ok, poor atomic.Int32
			var wg sync.WaitGroup
			var mu sync.Mutex
			won := -1 // one withdrawal that went through
			for i := range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, created, err := s.Withdraw(ctx, app.Movement{ID: fmt.Sprintf("w%d", i), UserID: "u1", Key: fmt.Sprintf("k%d", i), Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil)
					switch {
					case err == nil && created:
						ok.Add(1)
						mu.Lock()
						won = i
						mu.Unlock()
					case errors.Is(err, app.ErrInsufficientFunds):
						poor.Add(1)
					default:
						t.Errorf("Withdraw = %v", err)
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 10 || poor.Load() != 20 {
				t.Errorf("withdrawals: %d succeeded, %d refused; want 10 and 20", ok.Load(), poor.Load())
			}
			if won < 0 {
				t.Fatal("no withdrawal went through")
			}
			first, created, err := s.Withdraw(ctx, app.Movement{ID: "wx", UserID: "u1", Key: fmt.Sprintf("k%d", won), Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil)
			if err != nil || created || first.ID != fmt.Sprintf("w%d", won) {
				t.Errorf("Withdraw(same key) = %+v, %v, %v; want w%d back, not created", first, created, err, won)
			}
			for i := range 2 { // a failed payout refunds once
				if moved, err := s.SettleWithdrawal(ctx, fmt.Sprintf("w%d", won), false, time.UnixMicro(now)); err != nil || moved != (i == 0) {
					t.Fatalf("SettleWithdrawal #%d = %v, %v; want moved only the first time", i+1, moved, err)
				}
			}
			bal, sum, err := s.Balance(ctx, "u1")
			if err != nil || bal != 1000 || sum != bal {
				t.Errorf("balance %v, ledger sum %v, %v; want 10.00 and equal", bal, sum, err)
			}
		})
	}
}

// PITFALLS 1: hold a lease, let it expire, let another holder take it,
// then make the first one write: refused, and nothing changes.
func TestStaleFenceRefused(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, now := withUser(t, d)
			ctx := context.Background()
			_, _, _ = s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 10000, CreatedAt: time.UnixMicro(now)})
			if _, err := s.SettleDeposit(ctx, "d1", true, time.UnixMicro(now)); err != nil {
				t.Fatal(err)
			}
			locks := lock.New(&memlock.Backend{}, nil)
			slow, _ := locks.TryAcquire(ctx, "user:u1", 20*time.Millisecond)
			<-slow.Done() // paused past its TTL
			next, err := locks.Acquire(ctx, "user:u1", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w1", UserID: "u1", Key: "k1", Amount: 1000, CreatedAt: time.UnixMicro(now)}, next.Fence(), nil); err != nil {
				t.Fatalf("Withdraw by the current holder = %v", err)
			}
			if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w2", UserID: "u1", Key: "k2", Amount: 1000, CreatedAt: time.UnixMicro(now)}, slow.Fence(), nil); !errors.Is(err, app.ErrStaleFence) {
				t.Errorf("Withdraw by the stale holder = %v; want ErrStaleFence", err)
			}
			if bal, sum, _ := s.Balance(ctx, "u1"); bal != 9000 || sum != bal {
				t.Errorf("balance %v, ledger %v; want 90.00: only the current holder's write", bal, sum)
			}
			if _, err := s.MovementByID(ctx, app.Withdrawal, "u1", "w2"); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("the refused withdrawal's row = %v; want none", err)
			}
			_ = next.Release(ctx)
		})
	}
}

// A settlement and the Idempotency-Key record it completes (Records)
// commit together or not at all on MySQL and SQLite, in one transaction.
// On PostgreSQL a withdrawal's success settles and completes its record in
// one statement (Records.CompleteCTE): a record refused there leaves the
// settlement committed and says so (app.ErrRecordLost). The completer here
// marks a row of a table of its own, once, as completing a record does.
func TestSettleRecord(t *testing.T) { inEachSettleMode(t, testSettleRecord) }

func testSettleRecord(t *testing.T, d database, s *sqlstore.Store, db *sql.DB, now int64) {
	ctx := context.Background()
	q := d.rebind
	markTable(t, db)
	for _, id := range []string{"w1", "w2"} {
		if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO also_t (id, done) VALUES ('a1', 0), ('a2', 0), ('a3', 0)`); err != nil {
		t.Fatal(err)
	}
	s.Records = markOnce{stmt: q(`UPDATE also_t SET done = 1 WHERE id = ? AND done = 0`)}
	settle := func(id, rec string) (bool, error) {
		moved, _, err := s.Settle(ctx, app.Withdrawal, id, app.Succeeded, time.UnixMicro(now), &app.Record{ID: rec, Lease: "l"}, "")
		return moved, err
	}
	state := func(mov, a string) (status string, done int) {
		t.Helper()
		if err := db.QueryRowContext(ctx, q(`SELECT status FROM withdrawals WHERE id = ?`), mov).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, q(`SELECT done FROM also_t WHERE id = ?`), a).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return status, done
	}

	// Both commit.
	if moved, err := settle("w1", "a1"); err != nil || !moved {
		t.Fatalf("SettleWithdrawal = %v, %v; want moved", moved, err)
	}
	if st, done := state("w1", "a1"); st != "succeeded" || done != 1 {
		t.Errorf("after a settlement: %s, done %d; want succeeded, 1", st, done)
	}
	if d.dialect == sqldialect.Postgres {
		// The record is refused (a lost lease): the settlement commits, the loss is told.
		if moved, err := settle("w2", "a1"); !errors.Is(err, app.ErrRecordLost) || !errors.Is(err, errRefused) || !moved {
			t.Errorf("Settle with a refused record = %v, %v; want moved, ErrRecordLost", moved, err)
		}
		if st, _ := state("w2", "a2"); st != "succeeded" {
			t.Errorf("after a refused record: %s; want succeeded", st)
		}
	} else {
		// The record is refused (a lost lease): nothing commits.
		if moved, err := settle("w2", "a1"); !errors.Is(err, errRefused) || moved {
			t.Errorf("Settle with a refused record = %v, %v; want the refusal", moved, err)
		}
		if st, _ := state("w2", "a2"); st != "pending" {
			t.Errorf("after a refused record: %s; want pending", st)
		}
	}
	// Settled before: not moved, the record still commits.
	if moved, err := settle("w1", "a2"); err != nil || moved {
		t.Errorf("SettleWithdrawal of a settled one = %v, %v; want not moved", moved, err)
	}
	if st, done := state("w1", "a2"); st != "succeeded" || done != 1 {
		t.Errorf("after settling again: %s, done %d; want succeeded, 1", st, done)
	}
	// No such movement: ErrNotFound, and the record does not commit.
	if _, err := settle("w9", "a3"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("SettleWithdrawal of no movement = %v; want ErrNotFound", err)
	}
	if _, done := state("w2", "a3"); done != 0 {
		t.Errorf("the record of a missing movement committed")
	}
	if bal, sum, _ := s.Balance(ctx, "u1"); bal != 8000 || sum != bal {
		t.Errorf("balance %v, ledger %v; want 80.00", bal, sum)
	}
	// The backlog: w2 is still pending where its refused record rolled it back.
	want := 1
	if d.dialect == sqldialect.Postgres {
		want = 0
	}
	if n, err := s.PendingCount(ctx); err != nil || n != want {
		t.Errorf("PendingCount = %d, %v; want %d", n, err, want)
	}
}

// The backlog follows the movements through the store, on every database:
// a deposit or a withdrawal is in it from its creation to its settlement
// (whichever settles it, once), oldest first; a second settlement and one
// of a movement that does not exist change nothing.
func TestBacklog(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, _, now := withUserDB(t, d)
			ctx := context.Background()
			count := func(want int) {
				t.Helper()
				if n, err := s.PendingCount(ctx); err != nil || n != want {
					t.Fatalf("PendingCount = %d, %v; want %d", n, err, want)
				}
			}
			pending := func(k app.Kind, want string) {
				t.Helper()
				got, err := s.Pending(ctx, k, 10)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, m := range got {
					if m.Status != app.Pending || m.Kind != k {
						t.Errorf("Pending(%s) gave %s %s %s", k, m.ID, m.Kind, m.Status)
					}
					ids = append(ids, m.ID)
				}
				if strings.Join(ids, " ") != want {
					t.Errorf("Pending(%s) = %v; want %q", k, ids, want)
				}
			}
			count(0)
			for i, id := range []string{"d1", "d2"} {
				if _, created, err := s.CreateDeposit(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 10000, CreatedAt: time.UnixMicro(now + int64(i))}); err != nil || !created {
					t.Fatalf("CreateDeposit(%s) = %v, %v", id, created, err)
				}
			}
			if _, created, _ := s.CreateDeposit(ctx, app.Movement{ID: "d3", UserID: "u1", Key: "kd1", Amount: 10000, CreatedAt: time.UnixMicro(now)}); created {
				t.Fatal("a second deposit under kd1 was created")
			}
			count(2)
			pending(app.Deposit, "d1 d2")
			if moved, err := s.SettleDeposit(ctx, "d1", true, time.UnixMicro(now)); err != nil || !moved {
				t.Fatalf("SettleDeposit(d1) = %v, %v", moved, err)
			}
			if moved, err := s.SettleDeposit(ctx, "d1", false, time.UnixMicro(now)); err != nil || moved {
				t.Fatalf("SettleDeposit(d1) again = %v, %v; want not moved", moved, err)
			}
			if _, err := s.SettleDeposit(ctx, "d9", true, time.UnixMicro(now)); !errors.Is(err, app.ErrNotFound) {
				t.Fatalf("SettleDeposit(d9) = %v; want ErrNotFound", err)
			}
			count(1)
			pending(app.Deposit, "d2")
			for i, id := range []string{"w2", "w1"} { // w2 first: older
				if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 1000, CreatedAt: time.UnixMicro(now + 10 + int64(i))}, 0, nil); err != nil {
					t.Fatal(err)
				}
			}
			count(3)
			pending(app.Withdrawal, "w2 w1")
			if moved, err := s.SettleWithdrawal(ctx, "w2", false, time.UnixMicro(now)); err != nil || !moved {
				t.Fatalf("SettleWithdrawal(w2) = %v, %v", moved, err)
			}
			count(2)
			pending(app.Withdrawal, "w1")
			pending(app.Deposit, "d2")
		})
	}
}

var errRefused = errors.New("record refused")

// inEachSettleMode runs a settlement test on every database (withFunds) with
// Store.BatchSettle off, and on PostgreSQL with it on too (subtest "postgres-batched": each
// settlement there a batch of its own; TestSettleBatch runs batches of several).
func inEachSettleMode(t *testing.T, test func(t *testing.T, d database, s *sqlstore.Store, db *sql.DB, now int64)) {
	run := func(d database, batched bool) func(t *testing.T) {
		return func(t *testing.T) {
			s, db, now := withFunds(t, d)
			s.BatchSettle = batched
			test(t, d, s, db, now)
		}
	}
	for _, d := range databases {
		t.Run(d.name, run(d, false))
		if d.dialect == sqldialect.Postgres {
			t.Run(d.name+"-batched", run(d, true))
		}
	}
}

// markTable creates also_t, markOnce's table, for the test.
func markTable(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE also_t (id VARCHAR(20) PRIMARY KEY, done INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), `DROP TABLE also_t`) })
}

// markOnce completes a "record" by marking its row of also_t, once.
type markOnce struct {
	sqlstore.RecordCompleter // only CompleteTx is used
	stmt                     string
}

// CompleteCTE is CompleteTx composed into PostgreSQL's one statement.
func (m markOnce) CompleteCTE(id, _ string, _ idemstore.Response, first int) (idemsql.CTE, error) {
	return idemsql.CTE{
		With:   fmt.Sprintf(`mark AS (UPDATE also_t SET done = 1 WHERE id = $%d AND done = 0 RETURNING 1)`, first),
		Result: `(SELECT count(*) FROM mark)`,
		Args:   []any{id},
	}, nil
}

// CompleteManyCTE is CompleteTx composed into a batch's one statement (sqlstore.ManyCompleter).
func (m markOnce) CompleteManyCTE(from string, _ int) (idemsql.CTE, error) {
	return idemsql.CTE{
		With:   `mark_many AS (UPDATE also_t a SET done = 1 FROM ` + from + ` f WHERE a.id = f.id AND a.done = 0 RETURNING a.id)`,
		Result: "mark_many",
	}, nil
}

// failMany is markOnce whose batch statement fails when it runs.
type failMany struct{ markOnce }

func (failMany) CompleteManyCTE(from string, _ int) (idemsql.CTE, error) {
	return idemsql.CTE{
		With:   `mark_many AS (SELECT f.id FROM ` + from + ` f WHERE CAST(f.id || 'x' AS int) = 0)`,
		Result: "mark_many",
	}, nil
}

func (m markOnce) Completed(n int64, err error) error {
	if err == nil && n == 0 {
		err = errRefused
	}
	return err
}

func (m markOnce) CompleteTx(ctx context.Context, tx *sql.Tx, id, _ string, _ idemstore.Response) error {
	res, err := tx.ExecContext(ctx, m.stmt, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errRefused
	}
	return nil
}

// A settlement whose outcome contradicts one committed before (a provider
// whose answer contradicts its callback) commits nothing, not the key's
// record, and reports the committed status, on every database; the record
// then completes under a settlement to that status. One that waits for
// another's uncommitted settlement of the same movement does the same
// with the status that other committed, not the pending one its statement
// began with. A settlement to Pending, which would take a pending movement
// out of the backlog, is refused.
func TestSettleConcurrent(t *testing.T) { inEachSettleMode(t, testSettleConcurrent) }

func testSettleConcurrent(t *testing.T, d database, s *sqlstore.Store, db *sql.DB, now int64) {
	ctx := context.Background()
	q := d.rebind
	if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w1", UserID: "u1", Key: "kw1", Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if moved, _, err := s.Settle(ctx, app.Withdrawal, "w1", app.Pending, time.UnixMicro(now), nil, ""); err == nil || moved {
		t.Errorf("Settle to pending = %v, %v; want refused", moved, err)
	}
	if n, err := s.PendingCount(ctx); err != nil || n != 1 {
		t.Errorf("PendingCount after a refused settlement to pending = %d, %v; want 1", n, err)
	}
	markTable(t, db)
	if _, err := db.ExecContext(ctx, `INSERT INTO also_t (id, done) VALUES ('a1', 0), ('a2', 0)`); err != nil {
		t.Fatal(err)
	}
	s.Records = markOnce{stmt: q(`UPDATE also_t SET done = 1 WHERE id = ? AND done = 0`)}
	recDone := func(id string) (done int) {
		t.Helper()
		if err := db.QueryRowContext(ctx, q(`SELECT done FROM also_t WHERE id = ?`), id).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done
	}

	// Settled otherwise before.
	if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w2", UserID: "u1", Key: "kw2", Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SettleWithdrawal(ctx, "w2", false, time.UnixMicro(now)); err != nil {
		t.Fatal(err)
	}
	if moved, status, err := s.Settle(ctx, app.Withdrawal, "w2", app.Succeeded, time.UnixMicro(now), &app.Record{ID: "a2", Lease: "l"}, ""); err != nil || moved || status != app.Failed {
		t.Errorf("Settle contradicting a settlement before = %v, %s, %v; want not moved, failed", moved, status, err)
	}
	if recDone("a2") != 0 {
		t.Error("a contradicting settlement completed the key's record")
	}
	if moved, status, err := s.Settle(ctx, app.Withdrawal, "w2", app.Failed, time.UnixMicro(now), &app.Record{ID: "a2", Lease: "l"}, ""); err != nil || moved || status != app.Failed || recDone("a2") != 1 {
		t.Errorf("Settle to the committed status = %v, %s, %v, record done %d; want not moved, failed, 1", moved, status, err, recDone("a2"))
	}
	if bal, sum, _ := s.Balance(ctx, "u1"); bal != 9000 || sum != bal {
		t.Errorf("balance %v, ledger %v; want 90.00 (w1 debited, w2 refunded once)", bal, sum)
	}
	if d.dialect == sqldialect.SQLite {
		return // one writer: a settlement never waits for another's row
	}

	type result struct {
		moved  bool
		status app.Status
		err    error
	}
	// race settles id succeeded, with its record rec, while another
	// settlement holds the row, uncommitted, having set it to
	// otherStatus, and commits that other once this one waits.
	race := func(id, rec, otherStatus string) result {
		t.Helper()
		if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
			t.Fatal(err)
		}
		other, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Rollback()
		if _, err := other.ExecContext(ctx, q(`UPDATE withdrawals SET status = ? WHERE id = ? AND status = 'pending'`), otherStatus, id); err != nil {
			t.Fatal(err)
		}
		var otherPID int64
		if d.dialect == sqldialect.Postgres {
			if err := other.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
				t.Fatal(err)
			}
		}
		res := make(chan result, 1)
		go func() {
			moved, status, err := s.Settle(ctx, app.Withdrawal, id, app.Succeeded, time.UnixMicro(now), &app.Record{ID: rec, Lease: "l"}, "")
			res <- result{moved, status, err}
		}()
		// Only a session of this database blocked by the other settlement.
		waiting, args := `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))`, []any{otherPID}
		if d.dialect == sqldialect.MySQL {
			// MariaDB waits for a row it reads by its key while planning
			// ("Statistics"), before innodb_trx shows the wait.
			waiting, args = `SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE 'SELECT user_id, amount, status FROM withdrawals%FOR UPDATE'`, nil
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var n int
			if err := db.QueryRowContext(ctx, waiting, args...).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			select {
			case r := <-res:
				t.Fatalf("the settlement did not wait for the other's row: %v, %s, %v", r.moved, r.status, r.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the settlement never waited for the other's row")
			}
		}
		if err := other.Commit(); err != nil {
			t.Fatal(err)
		}
		return <-res
	}
	if r := race("w4", "a1", "failed"); r.err != nil || r.moved || r.status != app.Failed {
		t.Errorf("Settle after another failed it = %v, %s, %v; want not moved, failed", r.moved, r.status, r.err)
	}
	if recDone("a1") != 0 {
		t.Error("a settlement contradicting the one it waited for completed the key's record")
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO also_t (id, done) VALUES ('a3', 0)`); err != nil {
		t.Fatal(err)
	}
	if r := race("w3", "a3", "succeeded"); r.err != nil || r.moved || r.status != app.Succeeded {
		t.Errorf("Settle after another settled it the same = %v, %s, %v; want not moved, succeeded", r.moved, r.status, r.err)
	}
	if recDone("a3") != 1 {
		t.Error("a settlement agreeing with the one it waited for did not complete the key's record")
	}
}

// rebind rewrites ? placeholders for d's database.
func (d database) rebind(query string) string {
	if d.dialect == sqldialect.Postgres {
		return sqldb.Rebind(query)
	}
	return query
}

// On SQLite the store tells ObserveCommit each write COMMIT's group (one
// sign-up: one transaction); elsewhere there is no write gate to tell of.
func TestObserveCommit(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, _ := withUser(t, d)
			var mu sync.Mutex
			var groups []int
			s.ObserveCommit = func(members, waiting int) {
				mu.Lock()
				defer mu.Unlock()
				groups = append(groups, members)
			}
			if err := s.CreateUser(context.Background(), app.User{ID: "u2", Username: "bob", PasswordHash: "h", CreatedAt: time.Now()}, "CNY"); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []int{1}
			if d.dialect != sqldialect.SQLite {
				want = nil
			}
			if !slices.Equal(groups, want) {
				t.Errorf("ObserveCommit told %v; want %v", groups, want)
			}
		})
	}
}

// Withdrawals committed in one SQLite group move money as if one after
// another: of two with one key, the second finds the first's row (not
// committed yet) and returns it, but only after the COMMIT (its caller
// reads that row then); a withdrawal the group's earlier debits left no
// funds for is refused; and the ledger sums to the balance.
func TestWithdrawGrouped(t *testing.T) {
	d := databases[2]
	if d.dialect != sqldialect.SQLite {
		t.Fatal("databases[2] is not SQLite")
	}
	s, db, now := withFunds(t, d) // 100.00
	ctx := context.Background()
	g := s.Gate()
	held, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var holding sync.Once // the gate may run a group's functions twice (sqldb.WriteGate.Watch)
	wg.Go(func() {
		_ = g.Run(ctx, db, func(context.Context, *sql.Tx) error { holding.Do(func() { close(held) }); <-release; return nil })
	})
	<-held
	queued := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); g.Waiting() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d queued behind the gate; want %d", g.Waiting(), n)
			}
		}
	}
	type result struct {
		m       app.Movement
		created bool
		err     error
	}
	wds := []app.Movement{
		{ID: "w1", UserID: "u1", Key: "k1", Amount: 6000},
		{ID: "w2", UserID: "u1", Key: "k1", Amount: 6000}, // k1 again
		{ID: "w3", UserID: "u1", Key: "k3", Amount: 6000}, // 40.00 left
		{ID: "w4", UserID: "u1", Key: "k4", Amount: 4000},
	}
	results := make([]result, len(wds))
	w2done := make(chan struct{})
	var early atomic.Bool
	for i, m := range wds {
		m.CreatedAt = time.UnixMicro(now)
		wg.Go(func() {
			got, created, err := s.Withdraw(ctx, m, 0, nil)
			results[i] = result{got, created, err}
			if i == 1 {
				close(w2done)
			}
		})
		queued(i + 1)
	}
	// A member after them that waits for w2's Withdraw to return: it must
	// not, while the group is open.
	wg.Go(func() {
		_ = g.Run(ctx, db, func(context.Context, *sql.Tx) error {
			select {
			case <-w2done:
				early.Store(true)
			case <-time.After(300 * time.Millisecond):
			}
			return nil
		})
	})
	queued(len(wds) + 1)
	close(release)
	wg.Wait()
	if early.Load() {
		t.Error("w2 returned while its group was still open")
	}
	if r := results[0]; r.err != nil || !r.created || r.m.ID != "w1" {
		t.Errorf("w1 = %+v, %v, %v; want created", r.m, r.created, r.err)
	}
	if r := results[1]; r.err != nil || r.created || r.m.ID != "w1" {
		t.Errorf("w2 (k1 again) = %+v, %v, %v; want w1 back, not created", r.m, r.created, r.err)
	}
	if r := results[2]; !errors.Is(r.err, app.ErrInsufficientFunds) {
		t.Errorf("w3 (60.00 of 40.00 left) = %+v, %v, %v; want ErrInsufficientFunds", r.m, r.created, r.err)
	}
	if r := results[3]; r.err != nil || !r.created || r.m.ID != "w4" {
		t.Errorf("w4 = %+v, %v, %v; want created", r.m, r.created, r.err)
	}
	bal, sum, err := s.Balance(ctx, "u1")
	if err != nil || bal != 0 || sum != bal {
		t.Errorf("balance %v, ledger sum %v, %v; want 0 and equal", bal, sum, err)
	}
}

// With AsyncSettle, PostgreSQL commits a request's settlement of a
// withdrawal that succeeded without waiting for its WAL flush, and only that
// transaction: a deferred trigger reads synchronous_commit as each
// transaction that writes the withdrawal or a deposit commits. The debit's
// commit waits, the settlement's does not, the connection the settlement ran
// on is back to waiting for the next one, and a failed deposit's settlement
// (the same one-statement path, with its record) still waits. Without
// AsyncSettle every commit waits.
func TestAsyncSettle(t *testing.T) {
	d := databases[0]
	if d.dialect != sqldialect.Postgres {
		t.Fatal("databases[0] is not PostgreSQL")
	}
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			s, db, now := withFunds(t, d)
			ctx := context.Background()
			db.SetMaxOpenConns(1) // the settlement's connection is the next statement's
			var def string        // the server's setting, what every commit but one must use
			if err := db.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&def); err != nil {
				t.Fatal(err)
			}
			if def == "off" {
				t.Fatal("the test server runs synchronous_commit=off: nothing to tell apart")
			}
			for _, q := range []string{
				`CREATE TABLE also_t (id VARCHAR(20) PRIMARY KEY, done INTEGER NOT NULL)`,
				`INSERT INTO also_t (id, done) VALUES ('a1', 0), ('a2', 0)`,
				`CREATE TABLE commit_mode (n SERIAL PRIMARY KEY, op TEXT NOT NULL, sync TEXT NOT NULL)`,
				`CREATE OR REPLACE FUNCTION og_test_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO commit_mode (op, sync) VALUES (TG_TABLE_NAME || ' ' || TG_OP, current_setting('synchronous_commit')); RETURN NULL; END $$`,
				`CREATE CONSTRAINT TRIGGER commit_mode AFTER INSERT OR UPDATE ON withdrawals
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION og_test_commit_mode()`,
				`CREATE CONSTRAINT TRIGGER commit_mode AFTER UPDATE ON deposits
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION og_test_commit_mode()`,
			} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				for _, q := range []string{`DROP TABLE IF EXISTS also_t`, `DROP TABLE IF EXISTS commit_mode`, `DROP FUNCTION IF EXISTS og_test_commit_mode() CASCADE`} {
					_, _ = db.ExecContext(context.Background(), q)
				}
			})
			s.AsyncSettle = async
			s.Records = markOnce{}
			if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w1", UserID: "u1", Key: "k1", Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
				t.Fatal(err)
			}
			if moved, _, err := s.Settle(ctx, app.Withdrawal, "w1", app.Succeeded, time.UnixMicro(now), &app.Record{ID: "a1", Lease: "l"}, ""); err != nil || !moved {
				t.Fatalf("Settle = %v, %v; want moved", moved, err)
			}
			var after string
			if err := db.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil || after != def {
				t.Errorf("synchronous_commit on the settlement's connection after it = %q, %v; want %q", after, err, def)
			}
			if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d2", UserID: "u1", Key: "kd2", Amount: 1000, CreatedAt: time.UnixMicro(now)}); err != nil {
				t.Fatal(err)
			}
			if moved, _, err := s.Settle(ctx, app.Deposit, "d2", app.Failed, time.UnixMicro(now), &app.Record{ID: "a2", Lease: "l"}, ""); err != nil || !moved {
				t.Fatalf("Settle(deposit failed) = %v, %v; want moved", moved, err)
			}
			rows, err := db.QueryContext(ctx, `SELECT op || ' ' || sync FROM commit_mode ORDER BY n`)
			got := dbtest.Strings(t, rows, err)
			settled := def
			if async {
				settled = "off"
			}
			want := []string{"withdrawals INSERT " + def, "withdrawals UPDATE " + settled, "deposits UPDATE " + def}
			if !slices.Equal(got, want) {
				t.Errorf("synchronous_commit at the commits of the debit, its settlement, a failed deposit's: %q; want %q", got, want)
			}
			var status string
			var done int
			if err := db.QueryRowContext(ctx, `SELECT w.status, a.done FROM withdrawals w, also_t a WHERE w.id = 'w1' AND a.id = 'a1'`).Scan(&status, &done); err != nil || status != "succeeded" || done != 1 {
				t.Errorf("after the settlement: %s, record done %d, %v; want succeeded, 1", status, done, err)
			}
		})
	}
}

// A retry of a key whose withdrawal exists but whose record is gone (it
// expired, or was freed while the row stayed) gets the first withdrawal,
// created false, and a record of its own, made alone after the duplicate's
// rollback and holding the retry's lease: the Guard completes it with the
// first withdrawal's answer.
func TestWithdrawRetryRecordsItsKey(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db, now := withFunds(t, d)
			ctx := context.Background()
			keys, err := idemsql.New(db, d.dialect, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := keys.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			s.Records = keys
			at := time.UnixMicro(now)
			rec := fmt.Sprint("rec-k-", now) // the key store's tables are not emptied between runs
			start := func(lease string) *app.TxChecks {
				return &app.TxChecks{Start: &idemstore.Start{ID: rec, Fingerprint: "fp", Lease: lease,
					LeaseUntil: at.Add(time.Minute), ExpiresAt: at.Add(time.Hour), Now: at}}
			}
			if _, created, err := s.Withdraw(ctx, app.Movement{ID: "w1", UserID: "u1", Key: "k", Amount: 1000, CreatedAt: at}, 0, start("lease-1")); err != nil || !created {
				t.Fatalf("the first withdrawal = created %v, %v", created, err)
			}
			if err := keys.Abandon(ctx, rec, "lease-1"); err != nil { // its record freed; the row stays
				t.Fatal(err)
			}
			got, created, err := s.Withdraw(ctx, app.Movement{ID: "w2", UserID: "u1", Key: "k", Amount: 1000, CreatedAt: at}, 0, start("lease-2"))
			if err != nil || created || got.ID != "w1" {
				t.Fatalf("the retry = %s created %v, %v; want w1, not created", got.ID, created, err)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := keys.CompleteTx(ctx, tx, rec, "lease-2", idemstore.Response{Status: 201, Body: []byte("w1")}); err != nil {
				t.Fatalf("completing the retry's record under its lease = %v; want it there, in flight", err)
			}
			if bal, sum, _ := s.Balance(ctx, "u1"); bal != 9000 || sum != bal {
				t.Errorf("balance %v, ledger %v; want 90.00: one withdrawal", bal, sum)
			}
		})
	}
}

// On PostgreSQL with BatchSettle, the settlements of withdrawals that concurrent requests make
// at once run in one statement, each answered as alone: a pending withdrawal moved and its
// record completed; one settled the same way before, its record completed; one settled
// otherwise, its status and its record untouched; one missing, ErrNotFound; one whose record
// is gone, moved and ErrRecordLost. A batch whose statement fails commits nothing, and each
// of its settlements runs alone: each pending one is moved once, by its own statement. One
// that another settlement holds, uncommitted, is settled alone after it, as that one left it.
func TestSettleBatch(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprint("async=", async), func(t *testing.T) {
			s, db, now := withFunds(t, databases[0])
			s.AsyncSettle, s.BatchSettle = async, true
			ctx := context.Background()
			markTable(t, db)
			if _, err := db.ExecContext(ctx, `INSERT INTO also_t (id, done) SELECT 'a' || g, 0 FROM generate_series(1, 9) g`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE also_t SET done = 1 WHERE id = 'a5'`); err != nil {
				t.Fatal(err)
			}
			mark := markOnce{stmt: `UPDATE also_t SET done = 1 WHERE id = $1 AND done = 0`}
			s.Records = mark
			for _, id := range []string{"w1", "w2", "w3", "w5", "w6", "w7", "w8", "w9"} {
				if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.SettleWithdrawal(ctx, "w2", true, time.UnixMicro(now)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.SettleWithdrawal(ctx, "w3", false, time.UnixMicro(now)); err != nil {
				t.Fatal(err)
			}
			recs := func(ids ...string) []*app.Record {
				rs := make([]*app.Record, len(ids))
				for i, id := range ids {
					rs[i] = &app.Record{ID: "a" + id[1:], Lease: "l", Answer: app.Answer{Status: 201, Body: []byte("{}")}}
				}
				return rs
			}
			type want struct {
				moved  bool
				status app.Status
				err    error
			}
			check := func(ids []string, got []sqlstore.SettleResult, wants []want) {
				t.Helper()
				for i, w := range wants {
					g := got[i]
					if g.Moved != w.moved || g.Status != w.status || !errors.Is(g.Err, w.err) || (w.err == nil) != (g.Err == nil) {
						t.Errorf("%s: %+v; want moved %v, %q, %v", ids[i], g, w.moved, w.status, w.err)
					}
				}
			}

			ids := []string{"w1", "w2", "w3", "w4", "w5"}
			got, committed := s.SettleBatch(ctx, ids, recs(ids...))
			if !committed {
				t.Error("the batch did not commit")
			}
			check(ids, got, []want{{true, app.Succeeded, nil}, {false, app.Succeeded, nil}, {false, app.Failed, nil},
				{false, "", app.ErrNotFound}, {true, app.Succeeded, app.ErrRecordLost}})

			// The statement fails: each alone.
			s.Records = failMany{mark}
			ids = []string{"w6", "w7"}
			got, committed = s.SettleBatch(ctx, ids, recs(ids...))
			if committed {
				t.Error("a batch whose statement failed committed")
			}
			check(ids, got, []want{{true, app.Succeeded, nil}, {true, app.Succeeded, nil}})
			s.Records = mark

			// w8 held by another settlement, which fails it and commits once the batch waits.
			other, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			if _, err := other.ExecContext(ctx, `UPDATE withdrawals SET status = 'failed' WHERE id = 'w8' AND status = 'pending'`); err != nil {
				t.Fatal(err)
			}
			var otherPID int64
			if err := other.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
				t.Fatal(err)
			}
			type batchResult struct {
				got       []sqlstore.SettleResult
				committed bool
			}
			res := make(chan batchResult, 1)
			ids = []string{"w8", "w9"}
			go func() {
				got, committed := s.SettleBatch(ctx, ids, recs(ids...))
				res <- batchResult{got, committed}
			}()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				var n int
				if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))`, otherPID).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the batch never waited for the other settlement's row")
				}
			}
			if err := other.Commit(); err != nil {
				t.Fatal(err)
			}
			r := <-res
			if !r.committed {
				t.Error("the batch that waited did not commit")
			}
			check(ids, r.got, []want{{false, app.Failed, nil}, {true, app.Succeeded, nil}})

			for a, want := range map[string]int{"a1": 1, "a2": 1, "a3": 0, "a4": 0, "a5": 1, "a6": 1, "a7": 1, "a8": 0, "a9": 1} {
				var done int
				if err := db.QueryRowContext(ctx, `SELECT done FROM also_t WHERE id = $1`, a).Scan(&done); err != nil || done != want {
					t.Errorf("record %s: done %d, %v; want %d", a, done, err, want)
				}
			}
			for id, want := range map[string]string{"w1": "succeeded", "w2": "succeeded", "w3": "failed", "w5": "succeeded",
				"w6": "succeeded", "w7": "succeeded", "w8": "failed", "w9": "succeeded"} {
				var st string
				if err := db.QueryRowContext(ctx, `SELECT status FROM withdrawals WHERE id = $1`, id).Scan(&st); err != nil || st != want {
					t.Errorf("%s: %q, %v; want %s", id, st, err, want)
				}
			}
			// w8's backlog entry: the other settlement here is a bare UPDATE that left it; the
			// batch's statement took it out with its own.
			if n, err := s.PendingCount(ctx); err != nil || n != 0 {
				t.Errorf("PendingCount = %d, %v; want 0", n, err)
			}
		})
	}
}

// Concurrent settlements gather into batches: while the batches running are held, every
// other settlement queues, and the one batch after them carries all of it. Of 20 settlements
// at most 2 run outside a committed batch (the two held batches may hold one each), in at
// most 3 batches, and each is settled and its record completed once.
func TestSettleBatchesGather(t *testing.T) {
	const n = 20
	s, db, now := withUserDB(t, databases[0])
	ctx := context.Background()
	fund(t, s, "d1", 100000, now)
	markTable(t, db)
	s.Records = markOnce{stmt: `UPDATE also_t SET done = 1 WHERE id = $1 AND done = 0`}
	s.AsyncSettle, s.BatchSettle = true, true
	for i := range n {
		id := fmt.Sprint("w", i)
		if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 100, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO also_t (id, done) VALUES ($1, 0)`, fmt.Sprint("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range gather(t, n, s.HoldSettleBatches, s.SettleBatchState, func(i int) error {
		rec := &app.Record{ID: fmt.Sprint("a", i), Lease: "l", Answer: app.Answer{Status: 201, Body: []byte("{}")}}
		moved, status, err := s.Settle(ctx, app.Withdrawal, fmt.Sprint("w", i), app.Succeeded, time.UnixMicro(now), rec, "")
		if err == nil && (!moved || status != app.Succeeded) {
			err = fmt.Errorf("w%d: moved %v, %s", i, moved, status)
		}
		return err
	}) {
		t.Error(err)
	}
	batches, settlements := s.SettleBatches()
	if settlements < n-2 || batches > 3 {
		t.Errorf("%d settlements in %d committed batches; want at least %d in at most 3", settlements, batches, n-2)
	}
	var done, pending int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM also_t WHERE done = 1`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM withdrawals WHERE status = 'pending'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if done != n || pending != 0 {
		t.Errorf("%d records done, %d withdrawals pending; want %d, 0", done, pending, n)
	}
	if c, err := s.PendingCount(ctx); err != nil || c != 0 {
		t.Errorf("PendingCount = %d, %v; want 0", c, err)
	}
}
