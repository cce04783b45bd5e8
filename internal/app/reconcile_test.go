package app_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/app"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/sqlstore"
)

// The provider times out after paying, before paying, or declines: the
// withdrawal stays pending, the reconciler settles it by asking with the
// same key, and the provider shows exactly one payout per withdrawal.
func TestReconcile(t *testing.T) {
	db := dbtest.SQLite(t)
	ctx := context.Background()
	if err := sqlstore.Migrate(ctx, db, sqlstore.SQLite); err != nil {
		t.Fatal(err)
	}
	s := sqlstore.Open(db, sqlstore.SQLite)
	now := time.Now().UnixMicro()
	if err := s.CreateUser(ctx, "u1", "alice", "h", "CNY", now); err != nil {
		t.Fatal(err)
	}
	sim := &psp.Sim{}
	// Fund the account through a deposit whose charge timed out after the
	// money moved.
	if _, _, err := s.CreateDeposit(ctx, sqlstore.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 3000, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sim.Inject(psp.TimeoutAfterCommit)
	if _, err := sim.Do(ctx, psp.Charge, "d1", 3000); !errors.Is(err, psp.ErrUnknownOutcome) {
		t.Fatal(err)
	}
	if res, err := app.Reconcile(ctx, s, sim, 100); err != nil || res.Succeeded != 1 {
		t.Fatalf("Reconcile of the deposit = %+v, %v; want it settled", res, err)
	}
	if n, _ := sim.Moved(psp.Charge); n != 1 {
		t.Errorf("charges = %d; want 1 (the reconciler asked, it did not charge again)", n)
	}
	// Three withdrawals of 10.00, whose payouts time out after paying,
	// time out before paying, and are declined.
	sim.Inject(psp.TimeoutAfterCommit, psp.TimeoutBeforeCommit, psp.Decline)
	for _, id := range []string{"w1", "w2", "w3"} {
		if _, _, err := s.Withdraw(ctx, sqlstore.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 1000, CreatedAt: now}, 0); err != nil {
			t.Fatal(err)
		}
		if op, err := sim.Do(ctx, psp.Payout, id, 1000); err == nil && op.Status == psp.Failed {
			if err := s.SettleWithdrawal(ctx, id, false, now); err != nil { // a definite failure settles at once
				t.Fatal(err)
			}
		}
	}
	res, err := app.Reconcile(ctx, s, sim, 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Checked != 2 || res.Succeeded != 2 || res.StillPending != 0 {
		t.Errorf("Reconcile = %+v; want w1 and w2 settled succeeded", res)
	}
	if again, _ := app.Reconcile(ctx, s, sim, 100); again.Checked != 0 {
		t.Errorf("second pass checked %d; want nothing left pending", again.Checked)
	}
	if n, total := sim.Moved(psp.Payout); n != 2 || total != 2000 {
		t.Errorf("payouts %d (%v); want exactly 2 (w1 once, w2 once after reconciling), w3 declined", n, total)
	}
	bal, sum, err := s.Balance(ctx, "u1")
	if err != nil || bal != 1000 || sum != bal {
		t.Errorf("balance %v, ledger %v, %v; want 10.00 = 30.00 deposited - 20.00 paid out (w3 refunded)", bal, sum, err)
	}
}
