package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// settlesLater is a provider that accepts every charge as pending (it settles later, as
// `onceguard psp --async` does) and, asked again, says it succeeded, except for the keys in
// stuck, which stay pending at the provider (a charge awaiting the customer, say).
type settlesLater struct{ stuck map[string]bool }

func (settlesLater) Pay(context.Context, app.Kind, string, money.Amount) (app.Status, error) {
	return app.Pending, nil
}

func (p settlesLater) Lookup(_ context.Context, key string) (app.Status, error) {
	if p.stuck[key] {
		return app.Pending, nil
	}
	return app.Succeeded, nil
}

// The reconciler reaches every pending movement: movements that stay pending at the
// provider (here, a full pass's worth of old ones) must not hide a newer one whose
// callback never came, pass after pass.
func TestReconcilerReachesMovementsBehindStuckOnes(t *testing.T) {
	s, _, now := withAlice(t)
	ctx := context.Background()
	const limit = 100 // the Reconciler's default Limit
	stuck := map[string]bool{}
	for i := range limit {
		id := fmt.Sprintf("d%03d", i)
		stuck[id] = true
		if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: id, UserID: "u1", Key: id, Amount: 100, CreatedAt: time.UnixMicro(now + int64(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "late", UserID: "u1", Key: "late", Amount: 500, CreatedAt: time.UnixMicro(now + limit + 1)}); err != nil {
		t.Fatal(err)
	}
	svc := app.New(app.Config{Store: s, Provider: settlesLater{stuck: stuck}, Currency: "CNY", MaxAmount: 1_000_00})
	rc := &app.Reconciler{Service: svc}
	for range 5 {
		if _, err := rc.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m, err := svc.Movement(ctx, app.Deposit, "u1", "late")
	if err != nil || m.Status != app.Succeeded {
		t.Errorf("after 5 passes the deposit the provider settled is %q, %v; want succeeded", m.Status, err)
	}
}
