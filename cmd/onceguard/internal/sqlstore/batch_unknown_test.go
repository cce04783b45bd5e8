package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/sqldialect"
)

// proxiedSetup is debitSetup with the store's connections (and its key store's) through a fault
// proxy p; db reads the same database directly.
func proxiedSetup(t *testing.T, n int) (s *sqlstore.Store, db *sql.DB, p *faultproxy.Proxy, at time.Time) {
	t.Helper()
	db = dbtest.Postgres(t) // skips without ONCEGUARD_TEST_POSTGRES
	d := database{"postgres-proxied", sqldialect.Postgres, func(t testing.TB) *sql.DB {
		u, px := faultproxy.Front(t, os.Getenv("ONCEGUARD_TEST_POSTGRES"))
		p = px
		return dbtest.OpenPostgres(t, u)
	}}
	s, _, _, at = debitSetupOn(t, n, d)
	return s, db, p, at
}

// waitRows waits until query counts n rows: a statement on its way has committed.
func waitRows(t *testing.T, db *sql.DB, query string, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var c int
		if err := db.QueryRow(query).Scan(&c); err != nil {
			t.Fatal(err)
		}
		if c == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never %d rows", query, n)
		}
	}
}

// A batch of debits whose statement committed but whose answer is lost (the connection reset
// on its way back: an unknown outcome) debits each account once, and no member is told it
// succeeded: the batch's error stands (rolledBack), and a member run alone would find its key's
// record and row already made.
func TestDebitBatchUnknownOutcome(t *testing.T) {
	const n = 2
	s, db, p, at := proxiedSetup(t, n)
	ms, fences, chks := make([]app.Movement, n), make([]int64, n), make([]*app.TxChecks, n)
	for i := range n {
		ms[i] = app.Movement{ID: fmt.Sprint("w", i), UserID: fmt.Sprint("u", i), Key: "k", Amount: 100, CreatedAt: at}
		chks[i] = debitCheck(i, i, at)
	}
	p.SetLatency(300 * time.Millisecond)
	done := make(chan []sqlstore.WithdrawResult, 1)
	go func() {
		res, _ := s.DebitBatch(context.Background(), ms, fences, chks)
		done <- res
	}()
	waitRows(t, db, `SELECT count(*) FROM withdrawals`, n) // committed; its answer is held back
	p.Reset()
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	for i, w := range <-done {
		if w.Err == nil {
			t.Errorf("u%d: created %v and no error; want an error (the outcome is unknown)", i, w.Created)
		}
	}
	for i := range n {
		if bal, sum, err := s.Balance(context.Background(), fmt.Sprint("u", i)); err != nil || bal != 9900 || sum != bal {
			t.Errorf("u%d: balance %v, ledger %v, %v; want 99.00 (debited once)", i, bal, sum, err)
		}
	}
}

// A batch of settlements whose statement committed but whose answer is lost runs each settlement
// alone again, which changes nothing more: each withdrawal is settled once and its record
// completed once with its answer, and none is left pending.
func TestSettleBatchUnknownOutcome(t *testing.T) {
	const n = 2
	s, db, p, at := proxiedSetup(t, n)
	s.BatchSettle = true
	ctx := context.Background()
	ids, recs := make([]string, n), make([]*app.Record, n)
	for i := range n {
		ids[i] = fmt.Sprint("w", i)
		if _, _, err := s.Withdraw(ctx, app.Movement{ID: ids[i], UserID: fmt.Sprint("u", i), Key: "k", Amount: 100, CreatedAt: at}, 0, nil); err != nil {
			t.Fatal(err)
		}
		rec := fmt.Sprint("srec-", at.UnixMicro(), "-", i)
		if _, err := db.ExecContext(ctx, `INSERT INTO onceguard_idempotency (id, fingerprint, state, lease, lease_until, expires_at) VALUES ($1, 'fp', 1, 'l', $2, $2)`, rec, at.Add(time.Hour).UnixMicro()); err != nil {
			t.Fatal(err)
		}
		recs[i] = &app.Record{ID: rec, Lease: "l", Answer: app.Answer{Status: 201, Body: []byte(`{"id":"` + ids[i] + `"}`)}}
	}
	p.SetLatency(300 * time.Millisecond)
	done := make(chan []sqlstore.SettleResult, 1)
	go func() {
		res, _ := s.SettleBatch(ctx, ids, recs)
		done <- res
	}()
	waitRows(t, db, `SELECT count(*) FROM withdrawals WHERE status = 'succeeded'`, n)
	p.Reset()
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	for i, g := range <-done {
		if g.Status != app.Succeeded || (g.Err != nil && !errors.Is(g.Err, app.ErrRecordLost)) {
			t.Errorf("%s: %+v; want succeeded", ids[i], g)
		}
	}
	for i := range n {
		var state int
		var body []byte
		if err := db.QueryRowContext(ctx, `SELECT state, body FROM onceguard_idempotency WHERE id = $1`, recs[i].ID).Scan(&state, &body); err != nil || state != 2 || string(body) != string(recs[i].Answer.Body) {
			t.Errorf("record %d: state %d, body %s, %v; want completed with its answer", i, state, body, err)
		}
		if bal, sum, err := s.Balance(ctx, fmt.Sprint("u", i)); err != nil || bal != 9900 || sum != bal {
			t.Errorf("u%d: balance %v, ledger %v, %v; want 99.00", i, bal, sum, err)
		}
	}
	if c, err := s.PendingCount(ctx); err != nil || c != 0 {
		t.Errorf("PendingCount = %d, %v; want 0", c, err)
	}
}
