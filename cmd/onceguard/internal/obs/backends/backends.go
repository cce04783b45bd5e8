// Package backends holds the metrics hooks that know a backend's types
// (the SQL key store, the lock fallback), apart from obs so that the HTTP
// layer, which uses obs, depends on no backend.
package backends

import (
	"context"
	"database/sql"
	"log/slog"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/token"
)

// FallbackObserver returns a fallback.Options.OnStateChange that keeps
// the degraded gauge, counts switches and logs them.
func FallbackObserver(m *obs.Metrics, log *slog.Logger) func(from, to fallback.State, cause error) {
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

// KeyStore is the service's Idempotency-Key store: records, the
// repeat-submit window and submit tokens, and completion inside a
// settlement's transaction (idempotency/sqlstore.Store).
type KeyStore interface {
	idemstore.FullStore
	CompleteTx(ctx context.Context, tx *sql.Tx, id, lease string, resp idemstore.Response) error
	StartTx(ctx context.Context, tx *sql.Tx, st *idemstore.Start) error
	// Composed into the caller's PostgreSQL statement, timed with it.
	StartCTE(st *idemstore.Start, first int, after string) (idemsql.CTE, error)
	Started(ctx context.Context, st *idemstore.Start, created int64, err error) error
	CompleteCTE(id, lease string, resp idemstore.Response, first int) (idemsql.CTE, error)
	CompleteManyCTE(from string, first int) (idemsql.CTE, error)
	StartManyCTE(from string, first int, now time.Time) (idemsql.CTE, error)
	Completed(n int64, err error) error
	BindsSignedTokens() // signed submit tokens bound by the record (idemstore.SignedTokenStore)
}

// TimeKeys returns s with every call timed into db_duration_seconds, under
// the ops key_begin, key_complete, key_complete_tx, key_start_tx, key_abandon,
// window_claim, window_free, token_put, token_get, token_bind and
// token_unbind.
func TimeKeys(m *obs.Metrics, s KeyStore) KeyStore { return timedKeys{s: s, m: m} }

type timedKeys struct {
	s KeyStore
	m *obs.Metrics
}

func (t timedKeys) time(op string, start time.Time) {
	t.m.DB.WithLabelValues(op).Observe(obs.Since(start))
}

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

func (t timedKeys) StartTx(ctx context.Context, tx *sql.Tx, st *idemstore.Start) error {
	defer t.time("key_start_tx", time.Now())
	return t.s.StartTx(ctx, tx, st)
}

func (t timedKeys) StartCTE(st *idemstore.Start, first int, after string) (idemsql.CTE, error) {
	return t.s.StartCTE(st, first, after)
}

func (t timedKeys) Started(ctx context.Context, st *idemstore.Start, created int64, err error) error {
	return t.s.Started(ctx, st, created, err)
}

func (t timedKeys) CompleteCTE(id, lease string, resp idemstore.Response, first int) (idemsql.CTE, error) {
	return t.s.CompleteCTE(id, lease, resp, first)
}

func (t timedKeys) CompleteManyCTE(from string, first int) (idemsql.CTE, error) {
	return t.s.CompleteManyCTE(from, first)
}

func (t timedKeys) StartManyCTE(from string, first int, now time.Time) (idemsql.CTE, error) {
	return t.s.StartManyCTE(from, first, now)
}

func (t timedKeys) Completed(n int64, err error) error { return t.s.Completed(n, err) }

func (t timedKeys) BindsSignedTokens() {}

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
