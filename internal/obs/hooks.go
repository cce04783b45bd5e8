package obs

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/psp"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/token"
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
func LockResult(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, lock.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, lock.ErrNotAcquired):
		return "busy"
	default:
		return "error"
	}
}

// FallbackObserver returns a fallback.Options.OnStateChange that keeps
// the degraded gauge, counts switches and logs them.
func (m *Metrics) FallbackObserver(log *slog.Logger) func(from, to fallback.State, cause error) {
	return func(from, to fallback.State, cause error) {
		switch {
		case from == fallback.Closed && to != fallback.Closed:
			m.FallbackDegraded.Set(1)
			m.FallbackSwitches.WithLabelValues("database").Inc()
			msg := ""
			if cause != nil {
				msg = cause.Error()
			}
			log.Warn("locks fell back to the database: Redis does not answer", "cause", msg)
		case to == fallback.Closed:
			m.FallbackDegraded.Set(0)
			m.FallbackSwitches.WithLabelValues("redis").Inc()
			log.Info("locks are back on Redis")
		}
	}
}

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

// DBObserver returns a hook for the service's store that times its calls.
func (m *Metrics) DBObserver() func(op string, d time.Duration) {
	return func(op string, d time.Duration) { m.DB.WithLabelValues(op).Observe(d.Seconds()) }
}

// KeyStore is the service's Idempotency-Key store: records, the
// repeat-submit window and submit tokens, and completion inside a
// settlement's transaction (idempotency/sqlstore.Store).
type KeyStore interface {
	idemstore.FullStore
	CompleteTx(ctx context.Context, tx *sql.Tx, id, lease string, resp idemstore.Response) error
	CompleteStmt(ctx context.Context, id, lease string, resp idemstore.Response) (string, []any, error)
}

// TimeKeys returns s with every call timed into db_duration_seconds, under
// the ops key_begin, key_complete, key_complete_tx, key_abandon,
// window_claim, window_free, token_put, token_get, token_bind and
// token_unbind.
func (m *Metrics) TimeKeys(s KeyStore) KeyStore { return timedKeys{s: s, m: m} }

type timedKeys struct {
	s KeyStore
	m *Metrics
}

func (t timedKeys) time(op string, start time.Time) { t.m.DB.WithLabelValues(op).Observe(Since(start)) }

func (t timedKeys) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	defer t.time("key_begin", time.Now())
	return t.s.Begin(ctx, r)
}

func (t timedKeys) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	defer t.time("key_complete", time.Now())
	return t.s.Complete(ctx, id, lease, resp, now)
}

func (t timedKeys) CompleteTx(ctx context.Context, tx *sql.Tx, id, lease string, resp idemstore.Response) error {
	defer t.time("key_complete_tx", time.Now())
	return t.s.CompleteTx(ctx, tx, id, lease, resp)
}

// CompleteStmt only builds a statement: the caller's statement is timed.
func (t timedKeys) CompleteStmt(ctx context.Context, id, lease string, resp idemstore.Response) (string, []any, error) {
	return t.s.CompleteStmt(ctx, id, lease, resp)
}

func (t timedKeys) Abandon(ctx context.Context, id, lease string) error {
	defer t.time("key_abandon", time.Now())
	return t.s.Abandon(ctx, id, lease)
}

func (t timedKeys) ClaimWindow(ctx context.Context, id, owner string, window time.Duration, now time.Time) (time.Duration, error) {
	defer t.time("window_claim", time.Now())
	return t.s.ClaimWindow(ctx, id, owner, window, now)
}

func (t timedKeys) FreeWindow(ctx context.Context, id, owner string) error {
	defer t.time("window_free", time.Now())
	return t.s.FreeWindow(ctx, id, owner)
}

func (t timedKeys) PutToken(ctx context.Context, r token.Record) error {
	defer t.time("token_put", time.Now())
	return t.s.PutToken(ctx, r)
}

func (t timedKeys) GetToken(ctx context.Context, hash string) (token.Record, error) {
	defer t.time("token_get", time.Now())
	return t.s.GetToken(ctx, hash)
}

func (t timedKeys) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	defer t.time("token_bind", time.Now())
	return t.s.BindToken(ctx, hash, subject, purpose, scope, now)
}

func (t timedKeys) UnbindToken(ctx context.Context, hash, scope string) error {
	defer t.time("token_unbind", time.Now())
	return t.s.UnbindToken(ctx, hash, scope)
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
