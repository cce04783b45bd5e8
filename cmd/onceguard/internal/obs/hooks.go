package obs

import (
	"context"
	"errors"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/lock"
)

// LockObserver returns a lock.Options.Observe that counts acquires by
// result, observes wait and hold times and counts lost leases. backend
// names the backend serving now ("redis", "database", "memory"). It does
// not log: the service logs a failed acquire and a lost lease where it
// takes the lock, on the request's logger (with its request id).
func (m *Metrics) LockObserver(backend func() string) func(lock.Event) {
	return func(e lock.Event) {
		b := backend()
		switch e.Op {
		case lock.OpAcquire:
			m.LockAcquires.WithLabelValues(b, LockResult(e.Err)).Inc()
			m.LockWait.WithLabelValues(b).Observe(e.Duration.Seconds())
		case lock.OpRelease:
			m.LockHold.WithLabelValues(b).Observe(e.Duration.Seconds())
		case lock.OpLost:
			m.LockLost.WithLabelValues(b).Inc()
		}
	}
}

// LockResult is an acquire's result as lock_acquires_total counts it:
// acquired, busy (held by another), unavailable (the backend did not
// answer) or error.
func LockResult(err error) string { return app.LockResult(err) }

// Provider times every call to the payment provider it wraps.
type Provider struct {
	psp.Provider
	Metrics *Metrics
}

// Do implements psp.Provider.
func (p Provider) Do(ctx context.Context, kind psp.Kind, key string, amount money.Amount) (psp.Operation, error) {
	start := time.Now()
	op, err := p.Provider.Do(ctx, kind, key, amount)
	p.observe(string(kind), start, err)
	return op, err
}

// Lookup implements psp.Provider.
func (p Provider) Lookup(ctx context.Context, key string) (psp.Operation, error) {
	start := time.Now()
	op, err := p.Provider.Lookup(ctx, key)
	observed := err
	if errors.Is(err, psp.ErrNotFound) {
		observed = nil // an answer
	}
	p.observe("lookup", start, observed)
	return op, err
}

func (p Provider) observe(op string, start time.Time, err error) {
	result := "ok"
	switch {
	case errors.Is(err, psp.ErrUnknownOutcome):
		result = "unknown_outcome"
	case err != nil:
		result = "error"
	}
	p.Metrics.Provider.WithLabelValues(op, result).Observe(Since(start))
}

// CountMoney counts one audit line of a request (app.Config.Metrics).
func (m *Metrics) CountMoney(kind, outcome string) { m.Money.WithLabelValues(kind, outcome).Inc() }

// CountNotification counts one provider callback's answer (app.NotifyMetrics).
func (m *Metrics) CountNotification(outcome string) { m.Notifications.WithLabelValues(outcome).Inc() }

// EventPublished counts an event the relay published (events.Metrics).
func (m *Metrics) EventPublished() { m.EventsPublished.Inc() }

// EventRetried counts a failed publish put back for a retry (events.Metrics).
func (m *Metrics) EventRetried() { m.EventsRetried.Inc() }

// EventsPending sets the outbox's backlog (events.Metrics).
func (m *Metrics) EventsPending(n int) { m.EventsBacklog.Set(float64(n)) }

// CountReconciled counts a reconciler pass's results (app.ReconcilerMetrics).
func (m *Metrics) CountReconciled(succeeded, failed, stillPending int) {
	m.ReconcilerSettle.WithLabelValues("succeeded").Add(float64(succeeded))
	m.ReconcilerSettle.WithLabelValues("failed").Add(float64(failed))
	m.ReconcilerSettle.WithLabelValues("still_pending").Add(float64(stillPending))
}

// ObserveBacklog times the backlog count and sets the backlog gauge when it succeeded (app.ReconcilerMetrics).
func (m *Metrics) ObserveBacklog(n int, took time.Duration, err error) {
	m.DB.WithLabelValues("reconciler_backlog").Observe(took.Seconds())
	if err == nil {
		m.ReconcilerPend.Set(float64(n))
	}
}

// DBObserver returns a hook for the service's store that times its calls.
func (m *Metrics) DBObserver() func(op string, d time.Duration) {
	return func(op string, d time.Duration) { m.DB.WithLabelValues(op).Observe(d.Seconds()) }
}

// SQLiteCommitObserver returns a hook for the service's store on SQLite
// (sqlstore.Store.ObserveCommit): each COMMIT's group and the queue
// behind it.
func (m *Metrics) SQLiteCommitObserver() func(members, waiting int) {
	return func(members, waiting int) {
		m.SQLiteGroup.Observe(float64(members))
		m.SQLiteQueue.Set(float64(waiting))
	}
}

// TimeLockBackend returns b (a database lock backend) with its calls
// timed into db_duration_seconds, under the ops lock_acquire,
// lock_release and lock_refresh (and lock_wait_subscribe, lock_leave when
// b wakes waiters). It is what lock_wait_seconds is not: one round trip,
// not a whole blocking acquire.
func (m *Metrics) TimeLockBackend(b lock.Backend) lock.Backend {
	t := timedLock{b: b, m: m}
	if w, ok := b.(lock.Waiter); ok {
		return timedWaiter{timedLock: t, w: w}
	}
	return t
}

type timedLock struct {
	b lock.Backend
	m *Metrics
}

func (t timedLock) time(op string, start time.Time) { t.m.DB.WithLabelValues(op).Observe(Since(start)) }

func (t timedLock) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	defer t.time("lock_acquire", time.Now())
	return t.b.Acquire(ctx, r)
}

func (t timedLock) Release(ctx context.Context, key, owner string) error {
	defer t.time("lock_release", time.Now())
	return t.b.Release(ctx, key, owner)
}

func (t timedLock) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	defer t.time("lock_refresh", time.Now())
	return t.b.Refresh(ctx, key, owner, ttl)
}

type timedWaiter struct {
	timedLock
	w lock.Waiter
}

func (t timedWaiter) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	defer t.time("lock_wait_subscribe", time.Now())
	return t.w.Wait(ctx, key, owner)
}

func (t timedWaiter) Leave(ctx context.Context, key, owner string) error {
	defer t.time("lock_leave", time.Now())
	return t.w.Leave(ctx, key, owner)
}
