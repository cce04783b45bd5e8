// Package app is the reference service's domain: the rules that move money
// through the store and the payment provider.
package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/obs"
	"github.com/onceguard/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/sqlstore"
)

// ReconcileResult counts what one reconciliation pass did.
type ReconcileResult struct {
	Checked, Succeeded, Failed, StillPending int
	// Settled is each movement the pass settled, in order.
	Settled []Settlement
}

// Settlement is one pending movement a pass settled.
type Settlement struct {
	Kind    string // "deposit" or "withdrawal"
	ID      string
	UserID  string
	Key     string // its request's Idempotency-Key (or submit token): log only a hash
	Amount  money.Amount
	Outcome string // "succeeded" or "failed"
}

// Reconcile settles pending deposits and withdrawals, whose provider call
// ended with an unknown outcome (a timeout), by asking the provider under
// the same key: the movement's own id. Found: settle as the provider says.
// Not found (the call never reached it): send it again with the same key
// and the same amount, which is safe because the key makes it idempotent.
// Still unknown: leave it pending for the next pass. Never a new key:
// that could pay twice. It looks at up to limit movements of each kind. A
// movement whose settlement fails stays pending (counted StillPending) and
// the pass goes on with the others; the first such error is returned with
// the result.
func Reconcile(ctx context.Context, store *sqlstore.Store, provider psp.Provider, limit int) (ReconcileResult, error) {
	var (
		res      ReconcileResult
		firstErr error
	)
	for _, kind := range []struct {
		table, name string
		op          psp.Kind
	}{{"deposits", "deposit", psp.Charge}, {"withdrawals", "withdrawal", psp.Payout}} {
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
			var moved bool
			if kind.table == "deposits" {
				moved, err = store.SettleDeposit(ctx, m.ID, ok, now)
			} else {
				moved, err = store.SettleWithdrawal(ctx, m.ID, ok, now)
			}
			if err != nil {
				res.StillPending++
				if firstErr == nil {
					firstErr = fmt.Errorf("reconcile: settle %s %s: %w", kind.name, m.ID, err)
				}
				continue
			}
			if !moved {
				continue // its request settled it meanwhile, and said so
			}
			outcome := "failed"
			if ok {
				res.Succeeded++
				outcome = "succeeded"
			} else {
				res.Failed++
			}
			res.Settled = append(res.Settled, Settlement{Kind: kind.name, ID: m.ID, UserID: m.UserID, Key: m.Key, Amount: m.Amount, Outcome: outcome})
		}
	}
	return res, firstErr
}

// Backlog counts the deposits and withdrawals still pending: the
// reconciler's whole backlog, which one pass (Reconcile's limit) may not
// reach. It runs after every pass, so it must not read whole tables that
// only grow: sqlstore.PendingCount, like Reconcile's sqlstore.Pending,
// reads only the pending rows' entries of an index on status (schema
// migration 003), as many as the backlog. The write cost: each movement,
// created pending, adds an entry, and its settlement UPDATE, which changes
// status, removes it (moves it on MySQL, whose index holds every row); on
// PostgreSQL that UPDATE can no longer be HOT (status is in the partial
// index's predicate), so it also writes new entries into the table's other
// indexes, the primary key and UNIQUE (user_id, idempotency_key).
func Backlog(ctx context.Context, db *sql.DB) (int, error) {
	return sqlstore.PendingCount(ctx, db)
}

// Reconciler is the service's reconciler: each Pass settles what it can
// (Reconcile), writes one audit line per movement it settled, counts its
// results and sets the backlog gauge from a count of the pending rows.
type Reconciler struct {
	Store    *sqlstore.Store
	DB       *sql.DB // the Store's database, for the backlog count
	Provider psp.Provider
	Limit    int    // movements of each kind per pass (0: 100)
	Currency string // for the audit lines
	Metrics  *obs.Metrics
	Log      *slog.Logger // nil: none
}

// Pass runs one reconciliation pass.
func (rc *Reconciler) Pass(ctx context.Context) (ReconcileResult, error) {
	limit := rc.Limit
	if limit <= 0 {
		limit = 100
	}
	log := rc.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	res, err := Reconcile(ctx, rc.Store, rc.Provider, limit)
	for _, s := range res.Settled {
		log.Info("money", "audit", true, "kind", s.Kind, "id", s.ID, "user_id", s.UserID, "amount", s.Amount.String(),
			"currency", rc.Currency, "key_hash", obs.Hash(s.Key), "outcome", s.Outcome, "by", "reconciler")
	}
	if m := rc.Metrics; m != nil {
		m.ReconcilerSettle.WithLabelValues("succeeded").Add(float64(res.Succeeded))
		m.ReconcilerSettle.WithLabelValues("failed").Add(float64(res.Failed))
		m.ReconcilerSettle.WithLabelValues("still_pending").Add(float64(res.StillPending))
	}
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("reconciler pass failed", "error", err.Error())
		}
		return res, err
	}
	start := time.Now()
	backlog, berr := Backlog(ctx, rc.DB)
	if m := rc.Metrics; m != nil {
		m.DB.WithLabelValues("reconciler_backlog").Observe(obs.Since(start))
		if berr == nil {
			m.ReconcilerPend.Set(float64(backlog))
		}
	}
	if berr != nil && ctx.Err() == nil {
		log.Warn("reconciler backlog count failed", "error", berr.Error())
	}
	if res.Checked > 0 {
		log.Info("reconciler pass", "checked", res.Checked, "succeeded", res.Succeeded, "failed", res.Failed, "still_pending", res.StillPending, "backlog", backlog)
	}
	return res, berr
}
