package app_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/sqldialect"
)

// The provider times out after paying, before paying, or declines: the
// withdrawal stays pending, the reconciler settles it by asking with the
// same key, and the provider shows exactly one payout per withdrawal.
func TestReconcile(t *testing.T) {
	s, _, now := withAlice(t)
	ctx := context.Background()
	sim := &psp.Sim{}
	// Fund the account through a deposit whose charge timed out after the
	// money moved.
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 3000, CreatedAt: time.UnixMicro(now)}); err != nil {
		t.Fatal(err)
	}
	sim.Inject(psp.TimeoutAfterCommit)
	if _, err := sim.Do(ctx, psp.Charge, "d1", 3000); !errors.Is(err, psp.ErrUnknownOutcome) {
		t.Fatal(err)
	}
	if res, err := reconcile(ctx, s, sim, 100); err != nil || res.Succeeded != 1 {
		t.Fatalf("Reconcile of the deposit = %+v, %v; want it settled", res, err)
	}
	if n, _ := sim.Moved(psp.Charge); n != 1 {
		t.Errorf("charges = %d; want 1 (the reconciler asked, it did not charge again)", n)
	}
	// Three withdrawals of 10.00, whose payouts time out after paying,
	// time out before paying, and are declined.
	sim.Inject(psp.TimeoutAfterCommit, psp.TimeoutBeforeCommit, psp.Decline)
	for _, id := range []string{"w1", "w2", "w3"} {
		if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
			t.Fatal(err)
		}
		if op, err := sim.Do(ctx, psp.Payout, id, 1000); err == nil && op.Status == psp.Failed {
			if _, err := s.SettleWithdrawal(ctx, id, false, time.UnixMicro(now)); err != nil { // a definite failure settles at once
				t.Fatal(err)
			}
		}
	}
	res, err := reconcile(ctx, s, sim, 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Checked != 2 || res.Succeeded != 2 || res.StillPending != 0 {
		t.Errorf("Reconcile = %+v; want w1 and w2 settled succeeded", res)
	}
	if again, _ := reconcile(ctx, s, sim, 100); again.Checked != 0 {
		t.Errorf("second pass checked %d; want nothing left pending", again.Checked)
	}
	if n, total := sim.Moved(psp.Payout); n != 2 || total != 2000 {
		t.Errorf("payouts %d (%v); want exactly 2 (w1 once, w2 once after reconciling), w3 declined", n, total)
	}
	// Both under their withdrawal's own id (PITFALLS 22: an unknown
	// outcome is settled by asking, then retrying under the same key;
	// never by paying under a new one).
	for _, id := range []string{"w1", "w2"} {
		if op, err := sim.Lookup(ctx, id); err != nil || op.Status != psp.Succeeded {
			t.Errorf("the provider's payout under key %s = %+v, %v; want it succeeded under that key", id, op, err)
		}
	}
	bal, sum, err := s.Balance(ctx, "u1")
	if err != nil || bal != 1000 || sum != bal {
		t.Errorf("balance %v, ledger %v, %v; want 10.00 = 30.00 deposited - 20.00 paid out (w3 refunded)", bal, sum, err)
	}
}

// unknown is a provider whose every call ends with an unknown outcome.
type unknown struct{}

func (unknown) Do(context.Context, psp.Kind, string, money.Amount) (psp.Operation, error) {
	return psp.Operation{}, psp.ErrUnknownOutcome
}

func (unknown) Lookup(context.Context, string) (psp.Operation, error) {
	return psp.Operation{}, psp.ErrUnknownOutcome
}

// A Reconciler pass writes one audit line per movement it settles (by
// the reconciler), counts its results, and sets the backlog gauge from
// the pending rows, not from what one pass (capped by Limit) looked at.
func TestReconcilerPass(t *testing.T) {
	s, _, now := withAlice(t)
	ctx := context.Background()
	// Three pending deposits and one pending withdrawal (funded by a
	// settled deposit).
	for i, amt := range []money.Amount{100, 200, 300, 5000} {
		id := fmt.Sprintf("d%d", i)
		if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: id, UserID: "u1", Key: "key-" + id, Amount: amt, CreatedAt: time.UnixMicro(now + int64(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SettleDeposit(ctx, "d3", true, time.UnixMicro(now)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w0", UserID: "u1", Key: "key-w0", Amount: 400, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	m := obs.NewMetrics()
	prov := &switchable{Provider: unknown{}}
	svc := app.New(app.Config{Store: s, Provider: psp.Port(prov), Currency: "CNY", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	rc := &app.Reconciler{Service: svc, Limit: 2, Metrics: m}
	gauge := func() float64 {
		var d dto.Metric
		if err := m.ReconcilerPend.Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetGauge().GetValue()
	}
	counter := func(result string) float64 {
		var d dto.Metric
		if err := m.ReconcilerSettle.WithLabelValues(result).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetCounter().GetValue()
	}
	audits := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var line map[string]any
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			if line["msg"] == "money" {
				out = append(out, line)
			}
		}
		logs.Reset()
		return out
	}

	// The provider does not answer: the pass looks at 2 deposits and the
	// withdrawal, settles nothing; the backlog is all 4.
	res, err := rc.Pass(ctx)
	if err != nil || res.StillPending != 3 || len(res.Settled) != 0 {
		t.Fatalf("Pass = %+v, %v; want 3 still pending, nothing settled", res, err)
	}
	if g := gauge(); g != 4 {
		t.Errorf("reconciler_pending = %v; want 4 (the pending rows, not the %d one capped pass looked at)", g, res.StillPending)
	}
	if a := audits(); len(a) != 0 {
		t.Errorf("audit lines %v; want none (nothing settled)", a)
	}

	// The provider answers: each pass settles up to 2 of each kind, going on
	// where the last pass stopped (after d1) and starting over from the
	// oldest once it reached the newest; every settlement has its audit line.
	sim := &psp.Sim{}
	for i, id := range []string{"d0", "d1", "d2"} { // charged; their answers were lost
		if _, err := sim.Do(ctx, psp.Charge, id, money.Amount(100*(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	sim.Inject(psp.Decline)
	prov.Provider = sim
	res, err = rc.Pass(ctx)
	if err != nil || res.Succeeded != 1 || res.Failed != 1 || res.StillPending != 0 {
		t.Fatalf("Pass = %+v, %v; want d2 succeeded, w0 failed (declined)", res, err)
	}
	if g := gauge(); g != 2 {
		t.Errorf("reconciler_pending = %v; want 2 (d0, d1)", g)
	}
	want := map[string]string{
		"d2": "deposit u1 3.00 CNY " + obs.Hash("key-d2") + " succeeded reconciler",
		"w0": "withdrawal u1 4.00 CNY " + obs.Hash("key-w0") + " failed reconciler",
	}
	checkAudits := func(want map[string]string) {
		t.Helper()
		got := map[string]string{}
		for _, l := range audits() {
			got[fmt.Sprint(l["id"])] = fmt.Sprint(l["kind"], " ", l["user_id"], " ", l["amount"], " ", l["currency"], " ", l["key_hash"], " ", l["outcome"], " ", l["by"])
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("audit lines = %v; want %v", got, want)
		}
	}
	checkAudits(want)
	res, err = rc.Pass(ctx)
	if err != nil || res.Succeeded != 2 || len(res.Settled) != 2 {
		t.Fatalf("third Pass = %+v, %v; want d0, d1 settled", res, err)
	}
	checkAudits(map[string]string{
		"d0": "deposit u1 1.00 CNY " + obs.Hash("key-d0") + " succeeded reconciler",
		"d1": "deposit u1 2.00 CNY " + obs.Hash("key-d1") + " succeeded reconciler",
	})
	if g := gauge(); g != 0 {
		t.Errorf("reconciler_pending = %v; want 0", g)
	}
	if s, f, p := counter("succeeded"), counter("failed"), counter("still_pending"); s != 3 || f != 1 || p != 3 {
		t.Errorf("reconciler_settled_total = %v succeeded, %v failed, %v still_pending; want 3, 1, 3", s, f, p)
	}
}

// settlingFirst is a provider whose every Lookup lets the movement's own
// request settle it first: the race in which a request and the reconciler
// settle one movement at the same moment.
type settlingFirst struct {
	psp.Provider
	settle func(id string)
}

func (p settlingFirst) Lookup(ctx context.Context, key string) (psp.Operation, error) {
	op, err := p.Provider.Lookup(ctx, key)
	p.settle(key)
	return op, err
}

// A movement its request settled while the reconciler was asking about it
// is not the reconciler's: no audit line, no count, no second credit.
func TestReconcileSettledMeanwhile(t *testing.T) {
	s, _, now := withAlice(t)
	ctx := context.Background()
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 500, CreatedAt: time.UnixMicro(now)}); err != nil {
		t.Fatal(err)
	}
	sim := &psp.Sim{}
	if _, err := sim.Do(ctx, psp.Charge, "d1", 500); err != nil {
		t.Fatal(err)
	}
	p := settlingFirst{Provider: sim, settle: func(id string) {
		if moved, err := s.SettleDeposit(ctx, id, true, time.UnixMicro(now)); err != nil || !moved {
			t.Errorf("the request's SettleDeposit = %v, %v; want it to move the deposit", moved, err)
		}
	}}
	res, err := reconcile(ctx, s, p, 100)
	if err != nil || res.Checked != 1 || res.Succeeded != 0 || res.Failed != 0 || len(res.Settled) != 0 {
		t.Errorf("Reconcile = %+v, %v; want 1 checked and nothing settled by it", res, err)
	}
	if bal, sum, err := s.Balance(ctx, "u1"); err != nil || bal != 500 || sum != bal {
		t.Errorf("balance %v, ledger sum %v, %v; want 5.00 credited once", bal, sum, err)
	}
}

// withAlice returns a store on a fresh SQLite database with one user, u1
// (alice), its database, and the time the user was made at.
func withAlice(t *testing.T) (*sqlstore.Store, *sql.DB, int64) {
	t.Helper()
	db := dbtest.SQLite(t)
	ctx := context.Background()
	if err := sqlstore.Migrate(ctx, db, sqldialect.SQLite); err != nil {
		t.Fatal(err)
	}
	s := sqlstore.Open(db, sqldialect.SQLite)
	now := time.Now().UnixMicro()
	if err := s.CreateUser(ctx, app.User{ID: "u1", Username: "alice", PasswordHash: "h", CreatedAt: time.UnixMicro(now)}, "CNY"); err != nil {
		t.Fatal(err)
	}
	return s, db, now
}

// A movement whose settlement fails (here a deposit that would overflow
// its account's balance) stays pending and is reported, and the pass goes
// on: another user's paid-out withdrawal is still settled.
func TestReconcileGoesOnPastAFailedSettlement(t *testing.T) {
	s, db, now := withAlice(t)
	ctx := context.Background()
	if err := s.CreateUser(ctx, app.User{ID: "u2", Username: "bob", PasswordHash: "h", CreatedAt: time.UnixMicro(now)}, "CNY"); err != nil {
		t.Fatal(err)
	}
	settled := func(id, user string, amount money.Amount) {
		t.Helper()
		if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: id, UserID: user, Key: "k" + id, Amount: amount, CreatedAt: time.UnixMicro(now)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SettleDeposit(ctx, id, true, time.UnixMicro(now)); err != nil {
			t.Fatal(err)
		}
	}
	settled("full", "u1", money.Amount(math.MaxInt64-100))
	settled("d2", "u2", 5000)
	sim := &psp.Sim{}
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "over", UserID: "u1", Key: "kover", Amount: 1000, CreatedAt: time.UnixMicro(now)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Withdraw(ctx, app.Movement{ID: "w9", UserID: "u2", Key: "kw9", Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil {
		t.Fatal(err)
	}
	sim.Inject(psp.TimeoutAfterCommit, psp.TimeoutAfterCommit)
	_, _ = sim.Do(ctx, psp.Charge, "over", 1000)
	_, _ = sim.Do(ctx, psp.Payout, "w9", 1000)

	res, err := reconcile(ctx, s, sim, 100)
	if err == nil || res.Succeeded != 1 || res.StillPending != 1 {
		t.Errorf("Reconcile = %+v, %v; want w9 settled, the overflowing deposit still pending, and its error", res, err)
	}
	var status string
	if err := db.QueryRow(`SELECT status FROM withdrawals WHERE id = 'w9'`).Scan(&status); err != nil || status != "succeeded" {
		t.Errorf("w9 = %q, %v; want succeeded", status, err)
	}
	if bal, sum, err := s.Balance(ctx, "u1"); err != nil || bal != math.MaxInt64-100 || sum != bal {
		t.Errorf("u1: balance %v, ledger %v, %v; want the balance before the overflowing deposit, unchanged", bal, sum, err)
	}
}

// reconcile runs one Reconcile of a service on s and p.
func reconcile(ctx context.Context, s *sqlstore.Store, p psp.Provider, limit int) (app.ReconcileResult, error) {
	return app.New(app.Config{Store: s, Provider: psp.Port(p), Currency: "CNY"}).Reconcile(ctx, limit)
}

// switchable is a provider that can be replaced between passes.
type switchable struct{ psp.Provider }
