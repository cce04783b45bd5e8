// Package app is the reference service's domain: the rules that move money
// through the store and the payment provider.
package app

import (
	"context"
	"errors"
	"time"

	"github.com/onceguard/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/sqlstore"
)

// ReconcileResult counts what one reconciliation pass did.
type ReconcileResult struct {
	Checked, Succeeded, Failed, StillPending int
}

// Reconcile settles pending deposits and withdrawals, whose provider call
// ended with an unknown outcome (a timeout), by asking the provider under
// the same key: the movement's own id. Found: settle as the provider says.
// Not found (the call never reached it): send it again with the same key
// and the same amount, which is safe because the key makes it idempotent.
// Still unknown: leave it pending for the next pass. Never a new key:
// that could pay twice.
func Reconcile(ctx context.Context, store *sqlstore.Store, provider psp.Provider, limit int) (ReconcileResult, error) {
	var res ReconcileResult
	for _, kind := range []struct {
		table string
		op    psp.Kind
	}{{"deposits", psp.Charge}, {"withdrawals", psp.Payout}} {
		pending, err := store.Pending(ctx, kind.table, limit)
		if err != nil {
			return res, err
		}
		for _, m := range pending {
			res.Checked++
			op, err := provider.Lookup(ctx, m.ID)
			if errors.Is(err, psp.ErrNotFound) {
				op, err = provider.Do(ctx, kind.op, m.ID, m.Amount)
			}
			if err != nil {
				res.StillPending++ // unknown again: next pass
				continue
			}
			ok := op.Status == psp.Succeeded
			now := time.Now().UnixMicro()
			if kind.table == "deposits" {
				err = store.SettleDeposit(ctx, m.ID, ok, now)
			} else {
				err = store.SettleWithdrawal(ctx, m.ID, ok, now)
			}
			if err != nil {
				return res, err
			}
			if ok {
				res.Succeeded++
			} else {
				res.Failed++
			}
		}
	}
	return res, nil
}
