package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// PendingCursor is a place in the backlog's order (created_at, then id); the zero value is
// its start.
type PendingCursor struct {
	CreatedAt time.Time
	ID        string
}

// ReconcileResult counts what one reconciliation pass did.
type ReconcileResult struct {
	Checked, Succeeded, Failed, StillPending int
	// Settled is each movement the pass settled, in order.
	Settled []Settlement
}

// Settlement is one pending movement a pass settled.
type Settlement struct {
	Kind    Kind
	ID      string
	UserID  string
	Key     string // its request's Idempotency-Key (or submit token): log only a hash
	Amount  money.Amount
	Outcome Status
}

// Reconcile settles pending movements, whose provider call ended with an unknown outcome, by
// asking the provider under the same key, the movement's id: found, it settles as the provider
// says; not found (the call never reached it), it sends it again under that key; still unknown,
// it stays pending. Never a new key: that could pay twice. It looks at up to limit movements
// of each kind, going on where the last pass stopped and starting over from the oldest once it
// reached the newest, so that movements which stay pending at the provider cannot hide the
// ones behind them pass after pass; a settlement that fails leaves its movement pending (StillPending), the pass
// goes on, and the first such error is returned with the result.
func (s *Service) Reconcile(ctx context.Context, limit int) (ReconcileResult, error) {
	var (
		res      ReconcileResult
		firstErr error
	)
	for _, kind := range []Kind{Deposit, Withdrawal} {
		s.pendingMu.Lock()
		after := s.pendingAfter[kind]
		s.pendingMu.Unlock()
		pending, err := s.cfg.Store.PendingAfter(ctx, kind, after, limit)
		if err != nil {
			return res, err
		}
		next := PendingCursor{} // the newest reached: the next pass starts over
		if len(pending) >= limit {
			last := pending[len(pending)-1]
			next = PendingCursor{CreatedAt: last.CreatedAt, ID: last.ID}
		}
		s.pendingMu.Lock()
		if s.pendingAfter == nil {
			s.pendingAfter = map[Kind]PendingCursor{}
		}
		s.pendingAfter[kind] = next
		s.pendingMu.Unlock()
		for _, m := range pending {
			res.Checked++
			st, err := s.cfg.Provider.Lookup(ctx, m.ID)
			if errors.Is(err, ErrNoOperation) {
				st, err = s.cfg.Provider.Pay(ctx, kind, m.ID, m.Amount)
			}
			if err != nil || st == Pending {
				res.StillPending++ // unknown again, or not settled yet at the provider: next pass
				continue
			}
			m.Kind, m.Status = kind, st
			moved, _, err := s.settle(ctx, m, nil, "reconciler", "")
			if err != nil {
				res.StillPending++
				if firstErr == nil {
					firstErr = fmt.Errorf("reconcile: settle %s %s: %w", kind, m.ID, err)
				}
				continue
			}
			if !moved {
				continue // its request or a callback settled it meanwhile, and said so
			}
			if st == Succeeded {
				res.Succeeded++
			} else {
				res.Failed++
			}
			res.Settled = append(res.Settled, Settlement{Kind: kind, ID: m.ID, UserID: m.UserID, Key: m.Key, Amount: m.Amount, Outcome: st})
		}
	}
	return res, firstErr
}

// ReconcilerMetrics counts the reconciler's passes.
type ReconcilerMetrics interface {
	CountReconciled(succeeded, failed, stillPending int)
	ObserveBacklog(n int, took time.Duration, err error)
}

// Reconciler runs reconciliation passes; each settles what it can, counts its results and
// counts the whole backlog, which one pass (Limit) may not reach.
type Reconciler struct {
	Service *Service
	Limit   int               // movements of each kind per pass (0: 100)
	Metrics ReconcilerMetrics // nil: none
	Log     *slog.Logger      // nil: the Service's
}

// Pass runs one reconciliation pass.
func (rc *Reconciler) Pass(ctx context.Context) (ReconcileResult, error) {
	limit := rc.Limit
	if limit <= 0 {
		limit = 100
	}
	log := rc.Log
	if log == nil {
		log = rc.Service.log
	}
	ctx = WithLogger(ctx, log)
	res, err := rc.Service.Reconcile(ctx, limit)
	if rc.Metrics != nil {
		rc.Metrics.CountReconciled(res.Succeeded, res.Failed, res.StillPending)
	}
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("reconciler pass failed", "error", err.Error())
		}
		return res, err
	}
	start := time.Now()
	backlog, berr := rc.Service.cfg.Store.PendingCount(ctx)
	if rc.Metrics != nil {
		rc.Metrics.ObserveBacklog(backlog, time.Since(start), berr)
	}
	if berr != nil && ctx.Err() == nil {
		log.Warn("reconciler backlog count failed", "error", berr.Error())
	}
	if res.Checked > 0 {
		log.Info("reconciler pass", "checked", res.Checked, "succeeded", res.Succeeded, "failed", res.Failed, "still_pending", res.StillPending, "backlog", backlog)
	}
	return res, berr
}

// Run runs a pass every interval until ctx ends; each pass logs its own failures.
func (rc *Reconciler) Run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			_, _ = rc.Pass(ctx)
		case <-ctx.Done():
			return
		}
	}
}
