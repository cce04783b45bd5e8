package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
)

// debitSetup gives a test a PostgreSQL store with BatchDebit on and the real key store as its
// Records, and n users u0..u(n-1), each with 100.00 and a live session "s<i>".
func debitSetup(t *testing.T, n int) (*sqlstore.Store, *sql.DB, *idemsql.Store, time.Time) {
	t.Helper()
	return debitSetupOn(t, n, databases[0])
}

// debitSetupOn is debitSetup on d, a PostgreSQL database.
func debitSetupOn(t *testing.T, n int, d database) (*sqlstore.Store, *sql.DB, *idemsql.Store, time.Time) {
	t.Helper()
	s, db, now := withUserDB(t, d)
	ctx := context.Background()
	keys, err := idemsql.New(db, d.dialect, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s.Records, s.BatchDebit = keys, true
	at := time.UnixMicro(now)
	for i := range n {
		u := fmt.Sprint("u", i)
		if u != "u1" { // withUserDB made u1
			if err := s.CreateUser(ctx, app.User{ID: u, Username: "user-" + u, PasswordHash: "h", CreatedAt: at}, "CNY"); err != nil && !errors.Is(err, app.ErrUsernameTaken) {
				t.Fatal(err)
			}
		}
		if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d-" + u, UserID: u, Key: "kd-" + u, Amount: 10000, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SettleDeposit(ctx, "d-"+u, true, at); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSession(ctx, fmt.Sprint("s", i), u, at.Add(time.Hour), at); err != nil {
			t.Fatal(err)
		}
	}
	return s, db, keys, at
}

// debitCheck is user i's withdrawal checks: its session, and a record j (unique to this run: the
// key store's tables are not emptied between runs) with a window entry.
func debitCheck(i, j int, at time.Time) *app.TxChecks {
	rec := fmt.Sprint("rec-", at.UnixMicro(), "-", j)
	return &app.TxChecks{SessionHash: fmt.Sprint("s", i), Start: &idemstore.Start{ID: rec, Fingerprint: "fp", Lease: "lease-" + rec,
		LeaseUntil: at.Add(time.Minute), ExpiresAt: at.Add(time.Hour), Now: at,
		WindowID: fmt.Sprint("win-", at.UnixMicro(), "-", j), WindowOwner: idemstore.WindowOwner(rec, "a1"), WindowUntil: at.Add(10 * time.Second)}}
}

// On PostgreSQL with BatchDebit, the debits of concurrent withdrawals run in one statement,
// each answered as alone: when every one is debited, the batch commits them all, with their
// records, windows, rows, backlog and ledger entries. When one is refused (funds, an ended
// session, a key with a record, a window held, a stale fence, a key's row that exists), nothing
// of the batch commits and each runs alone: the refused one answers its reason, the others are
// debited once.
func TestDebitBatch(t *testing.T) {
	const n = 4
	s, db, _, at := debitSetup(t, n)
	ctx := context.Background()
	round := 0
	batch := func(mutate func(ms []app.Movement, fences []int64, chks []*app.TxChecks)) ([]sqlstore.WithdrawResult, bool, []*app.TxChecks) {
		round++
		ms, fences, chks := make([]app.Movement, n), make([]int64, n), make([]*app.TxChecks, n)
		for i := range n {
			ms[i] = app.Movement{ID: fmt.Sprint("w", round, "-", i), UserID: fmt.Sprint("u", i), Key: fmt.Sprint("k", round), Amount: 100, CreatedAt: at}
			chks[i] = debitCheck(i, round*n+i, at)
		}
		if mutate != nil {
			mutate(ms, fences, chks)
		}
		res, committed := s.DebitBatch(ctx, ms, fences, chks)
		return res, committed, chks
	}
	balance := func(u string) int64 {
		bal, sum, err := s.Balance(ctx, u)
		if err != nil || bal != sum {
			t.Fatalf("Balance(%s) = %v, ledger %v, %v", u, bal, sum, err)
		}
		return int64(bal)
	}
	inFlight := func(rec string) bool {
		var state int
		err := db.QueryRowContext(ctx, `SELECT state FROM onceguard_idempotency WHERE id = $1`, rec).Scan(&state)
		return err == nil && state == 1
	}
	windowOwner := func(id string) string {
		var owner string
		_ = db.QueryRowContext(ctx, `SELECT owner FROM onceguard_repeat_window WHERE id = $1`, id).Scan(&owner)
		return owner
	}
	want := map[string]int64{"u0": 10000, "u1": 10000, "u2": 10000, "u3": 10000}
	check := func(name string, res []sqlstore.WithdrawResult, chks []*app.TxChecks, refused int, reason func(error) bool) {
		t.Helper()
		for i, r := range res {
			st := chks[i].Start.(*idemstore.Start)
			if i == refused {
				if r.Created || !reason(r.Err) {
					t.Errorf("%s: the refused one = created %v, %v", name, r.Created, r.Err)
				}
				continue
			}
			if r.Err != nil || !r.Created {
				t.Errorf("%s: u%d = created %v, %v; want created", name, i, r.Created, r.Err)
				continue
			}
			want[fmt.Sprint("u", i)] -= 100
			if !inFlight(st.ID) || windowOwner(st.WindowID) != st.WindowOwner {
				t.Errorf("%s: u%d's record in flight %v, window owner %q; want in flight, %q", name, i, inFlight(st.ID), windowOwner(st.WindowID), st.WindowOwner)
			}
		}
		for u, b := range want {
			if got := balance(u); got != b {
				t.Errorf("%s: %s's balance %d; want %d", name, u, got, b)
			}
		}
	}

	res, committed, chks := batch(nil)
	if !committed {
		t.Fatal("a batch of withdrawals that all pass did not commit")
	}
	check("all pass", res, chks, -1, nil)
	if c, err := s.PendingCount(ctx); err != nil || c != n {
		t.Errorf("PendingCount = %d, %v; want %d", c, err, n)
	}

	cases := []struct {
		name   string
		mutate func(ms []app.Movement, fences []int64, chks []*app.TxChecks)
		reason func(error) bool
	}{
		{"funds", func(ms []app.Movement, _ []int64, _ []*app.TxChecks) { ms[2].Amount = 1_000_000 },
			func(err error) bool { return errors.Is(err, app.ErrInsufficientFunds) }},
		{"session ended", func(_ []app.Movement, _ []int64, chks []*app.TxChecks) { chks[2].SessionHash = "gone" },
			func(err error) bool { return errors.Is(err, app.ErrSessionEnded) }},
		{"key taken", func(_ []app.Movement, _ []int64, chks []*app.TxChecks) {
			st := chks[2].Start.(*idemstore.Start)
			if _, err := db.ExecContext(ctx, `INSERT INTO onceguard_idempotency (id, fingerprint, state, lease, lease_until, expires_at) VALUES ($1, 'fp', 1, 'other', 0, $2)`, st.ID, at.Add(time.Hour).UnixMicro()); err != nil {
				t.Fatal(err)
			}
		}, func(err error) bool { return errors.Is(err, idemstore.ErrKeyTaken) }},
		{"window held", func(_ []app.Movement, _ []int64, chks []*app.TxChecks) {
			st := chks[2].Start.(*idemstore.Start)
			if _, err := db.ExecContext(ctx, `INSERT INTO onceguard_repeat_window (id, owner, expires_at) VALUES ($1, 'another/a1', $2)`, st.WindowID, at.Add(time.Minute).UnixMicro()); err != nil {
				t.Fatal(err)
			}
		}, func(err error) bool { var held *idemstore.WindowHeldError; return errors.As(err, &held) }},
		{"stale fence", func(_ []app.Movement, fences []int64, _ []*app.TxChecks) {
			if _, err := db.ExecContext(ctx, `UPDATE accounts SET fence = 50 WHERE user_id = 'u2'`); err != nil {
				t.Fatal(err)
			}
			fences[2] = 40
		}, func(err error) bool { return errors.Is(err, app.ErrStaleFence) }},
		{"row exists", func(ms []app.Movement, _ []int64, _ []*app.TxChecks) { ms[2].Key = "k1" }, // u2's first withdrawal's key
			func(err error) bool { return err == nil }},
	}
	for _, c := range cases {
		res, committed, chks := batch(c.mutate)
		if committed {
			t.Errorf("%s: a batch with a refusal committed", c.name)
		}
		if c.name == "row exists" { // the key's row is answered as it is: the first withdrawal
			if r := res[2]; r.Err != nil || r.Created || r.Movement.ID != "w1-2" {
				t.Errorf("row exists: = %s created %v, %v; want w1-2, not created", r.Movement.ID, r.Created, r.Err)
			}
			res[2].Err = errors.New("checked")
			c.reason = func(err error) bool { return err != nil }
		}
		check(c.name, res, chks, 2, c.reason)
	}
}

// Concurrent withdrawals gather into batches: while the batches running are held, every other
// debit queues, and the one batch after them carries all of it. Of 20 withdrawals (of 20
// users) at most 2 run outside a committed batch, in at most 3 batches, and each is debited
// once.
func TestDebitBatchesGather(t *testing.T) {
	const n = 20
	s, _, _, at := debitSetup(t, n)
	ctx := context.Background()
	for _, err := range gather(t, n, s.HoldDebitBatches, s.DebitBatchState, func(i int) error {
		_, created, err := s.Withdraw(ctx, app.Movement{ID: fmt.Sprint("w", i), UserID: fmt.Sprint("u", i), Key: "k", Amount: 100, CreatedAt: at}, 0, debitCheck(i, i, at))
		if err == nil && !created {
			err = fmt.Errorf("u%d: not created", i)
		}
		return err
	}) {
		t.Error(err)
	}
	batches, debits := s.DebitBatches()
	if debits < n-2 || batches > 3 {
		t.Errorf("%d debits in %d committed batches; want at least %d in at most 3", debits, batches, n-2)
	}
	for i := range n {
		if bal, sum, err := s.Balance(ctx, fmt.Sprint("u", i)); err != nil || bal != 9900 || sum != bal {
			t.Errorf("u%d: balance %v, ledger %v, %v; want 99.00", i, bal, sum, err)
		}
	}
}

// The batch's statement finds each session, account and key by its index: planned with
// sequential scans turned off, it scans none of the tables it reads (a session's hash compared
// as text, not as its column's character type, would scan them all).
func TestDebitBatchPlan(t *testing.T) {
	s, db, _, at := debitSetup(t, 2)
	ctx := context.Background()
	ms := []app.Movement{{ID: "w0", UserID: "u0", Key: "k", Amount: 100, CreatedAt: at}, {ID: "w1", UserID: "u1", Key: "k", Amount: 100, CreatedAt: at}}
	q, args := s.DebitBatchQuery(ms, []int64{0, 0}, []*app.TxChecks{debitCheck(0, 0, at), debitCheck(1, 1, at)})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, "EXPLAIN "+q, args...)
	text := strings.Join(dbtest.Strings(t, rows, err), "\n")
	if !strings.Contains(text, "Update on accounts") {
		t.Fatalf("no plan of the batch's statement:\n%s", text)
	}
	if strings.Contains(text, "Seq Scan") {
		t.Errorf("the batch's statement scans a table:\n%s", text)
	}
}

// gather runs n requests, do(0) to do(n-1), each in a goroutine, with every batch held (hold)
// until all of them wait for a batch or are in a held one and every runner is held (state), and
// returns their errors.
func gather(t *testing.T, n int, hold func(func()), state func() (queued, inBatch, runners int), do func(i int) error) []error {
	t.Helper()
	release := make(chan struct{})
	var held atomic.Int32
	hold(func() {
		held.Add(1)
		<-release
	})
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- do(i) }()
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		queued, inBatch, runners := state()
		if queued+inBatch == n && int(held.Load()) == runners {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("requests never all queued: %d queued, %d in batches, %d runners, %d held", queued, inBatch, runners, held.Load())
		}
	}
	close(release)
	var out []error
	for range n {
		if err := <-errs; err != nil {
			out = append(out, err)
		}
	}
	return out
}

// sqlState is a server error of a given SQLSTATE, as pgx's.
type sqlState string

func (e sqlState) Error() string    { return "ERROR (SQLSTATE " + string(e) + ")" }
func (e sqlState) SQLState() string { return string(e) }

// A batch of debits runs alone again only when PostgreSQL said its statement failed while it
// ran: a refusal's cast, a constraint, a deadlock, an error in the statement. A server shutting
// down (class 57), a connection lost (no SQLSTATE) may come after its commit: each request
// answers it.
func TestDebitBatchRolledBack(t *testing.T) {
	for code, want := range map[string]bool{"22P02": true, "23505": true, "40P01": true, "42P01": true, "57P01": false, "08006": false, "": false} {
		if got := sqlstore.RolledBack(fmt.Errorf("batch: %w", sqlState(code))); got != want {
			t.Errorf("RolledBack(SQLSTATE %q) = %v; want %v", code, got, want)
		}
	}
	if sqlstore.RolledBack(errors.New("read tcp: connection reset by peer")) {
		t.Error("RolledBack(a connection's error) = true; want false")
	}
}
