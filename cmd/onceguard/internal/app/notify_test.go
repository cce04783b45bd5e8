package app_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// With a provider that settles later, a deposit answers pending and the
// reconciler leaves it so while the provider says pending; the callback
// settles it, once, and a second settler (the reconciler, the same event,
// another agreeing event) changes nothing; a contradiction is refused.
func TestNotifyAsync(t *testing.T) {
	s, _, _ := withAlice(t)
	ctx := context.Background()
	sim := &psp.Sim{Async: true, SettleAfter: time.Hour} // not Run: only the test settles
	svc := app.New(app.Config{Store: s, Provider: psp.Port(sim), Currency: "CNY", MaxAmount: 1_000_00})
	m, err := svc.Deposit(ctx, app.MoveRequest{UserID: "u1", Key: "k1", Amount: 500})
	if err != nil || m.Status != app.Pending {
		t.Fatalf("Deposit = %+v, %v; want pending", m, err)
	}
	if res, err := svc.Reconcile(ctx, 100); err != nil || res.StillPending != 1 || len(res.Settled) != 0 {
		t.Errorf("Reconcile while the provider says pending = %+v, %v; want it left pending", res, err)
	}
	n := app.Notification{EventID: "evt_1", Key: m.ID, Kind: app.Deposit, Amount: 500, Status: app.Succeeded}
	for _, again := range []app.Notification{n, n, {EventID: "evt_2", Key: m.ID, Kind: app.Deposit, Amount: 500, Status: app.Succeeded}} {
		if err := svc.Notify(ctx, again); err != nil {
			t.Errorf("Notify(%s) = %v; want nil", again.EventID, err)
		}
	}
	for _, bad := range []app.Notification{
		{EventID: "evt_3", Key: m.ID, Kind: app.Deposit, Amount: 500, Status: app.Failed},
		{EventID: "evt_4", Key: m.ID, Kind: app.Withdrawal, Amount: 500, Status: app.Succeeded},
		{EventID: "evt_5", Key: m.ID, Kind: app.Deposit, Amount: 501, Status: app.Succeeded},
	} {
		if err := svc.Notify(ctx, bad); app.ErrorCode(err) != app.CodeNotifyConflict {
			t.Errorf("Notify(%+v) = %v; want %s", bad, err, app.CodeNotifyConflict)
		}
	}
	if err := svc.Notify(ctx, app.Notification{EventID: "evt_6", Key: "dep_nope", Kind: app.Deposit, Amount: 500, Status: app.Succeeded}); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("Notify(unknown key) = %v; want ErrNotFound", err)
	}
	if b, l, err := s.Balance(ctx, "u1"); err != nil || b != 500 || l != 500 {
		t.Errorf("balance %v, ledger %v, %v; want 5.00, credited once", b, l, err)
	}
}
