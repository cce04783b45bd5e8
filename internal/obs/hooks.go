package obs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/psp"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
)

// LockObserver returns a lock.Options.Observe that counts acquires by
// result, observes wait and hold times, counts lost leases and logs them.
// backend names the backend serving now ("redis", "database", "memory").
func (m *Metrics) LockObserver(backend func() string, log *slog.Logger) func(lock.Event) {
	return func(e lock.Event) {
		b := backend()
		switch e.Op {
		case lock.OpAcquire:
			result := "acquired"
			switch {
			case e.Err == nil:
			case errors.Is(e.Err, lock.ErrUnavailable):
				result = "unavailable"
			case errors.Is(e.Err, lock.ErrNotAcquired):
				result = "busy"
			default:
				result = "error"
			}
			m.LockAcquires.WithLabelValues(b, result).Inc()
			m.LockWait.WithLabelValues(b).Observe(e.Duration.Seconds())
			if result == "error" || result == "unavailable" {
				log.Warn("lock acquire failed", "lock", e.Key, "backend", b, "error", e.Err.Error())
			}
		case lock.OpRelease:
			m.LockHold.WithLabelValues(b).Observe(e.Duration.Seconds())
		case lock.OpLost:
			m.LockLost.WithLabelValues(b).Inc()
			log.Warn("lock lost", "lock", e.Key, "backend", b, "held_ms", e.Duration.Milliseconds(), "cause", e.Err.Error())
		}
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
