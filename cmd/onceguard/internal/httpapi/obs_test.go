package httpapi_test

// Observability of the service's failure paths, driven through faults a
// test injects in process: a lock backend that does not answer or loses
// a lease at release, a key store that does not answer, a database and a
// provider that are down for /readyz. Each checks the counters and that
// the log lines are the request's (its request id).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs/backends"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/sqldialect"
)

// faultLocks is an in-process lock backend that can fail acquires (the
// backend does not answer), lose a lease at its release (the lock was
// found gone: expired under its holder; or found someone else's), or not
// answer a release (the lock stays until its TTL).
type faultLocks struct {
	*memlock.Backend
	unavailable          atomic.Bool
	loseAtRelease        atomic.Bool
	stolenAtRelease      atomic.Bool
	unreachableAtRelease atomic.Bool
	// onGrant, when set (before the requests), sees every lease granted.
	onGrant func(lock.Request, lock.Grant)
}

func (f *faultLocks) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if f.unavailable.Load() {
		return lock.Grant{}, fmt.Errorf("fault: %w", lock.ErrUnavailable)
	}
	g, err := f.Backend.Acquire(ctx, r)
	if err == nil && f.onGrant != nil {
		f.onGrant(r, g)
	}
	return g, err
}

func (f *faultLocks) Release(ctx context.Context, key, owner string) error {
	if f.unreachableAtRelease.Load() {
		return fmt.Errorf("fault: release %q: %w: i/o timeout", key, lock.ErrUnavailable)
	}
	err := f.Backend.Release(ctx, key, owner)
	if err == nil && f.loseAtRelease.Load() {
		return fmt.Errorf("fault: %w", lock.ErrExpired)
	}
	if err == nil && f.stolenAtRelease.Load() {
		return fmt.Errorf("fault: held by another owner: %w", lock.ErrNotHeld)
	}
	return err
}

// faultKeys is the service's key store, whose Begin can fail as a store
// that does not answer.
type faultKeys struct {
	backends.KeyStore
	down atomic.Bool
}

func (f *faultKeys) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	if f.down.Load() {
		return idemstore.BeginResult{}, fmt.Errorf("fault: %w", idempotency.ErrUnavailable)
	}
	return f.KeyStore.Begin(ctx, r)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type obsHarness struct {
	h       http.Handler
	metrics *obs.Metrics
	locks   *faultLocks
	keys    *faultKeys
	logs    *lockedBuffer
	token   string // alice's session
}

// harnessConfig is what a harness's options may change: the HTTP layer's
// config, the service's, its provider and (to read) its store.
type harnessConfig struct {
	httpapi.Config
	App      app.Config
	Provider psp.Provider
	Store    *sqlstore.Store
	// WrapStore, if set, wraps Store as the service sees it (to inject faults).
	WrapStore func(app.Store) app.Store
}

func newObsHarness(t *testing.T, comps []httpapi.Component, ping func(context.Context) error, opts ...func(*harnessConfig)) *obsHarness {
	t.Helper()
	ctx := context.Background()
	db := openSQLite(t, t.TempDir())
	if err := sqlstore.Migrate(ctx, db, sqldialect.SQLite); err != nil {
		t.Fatal(err)
	}
	keys, err := idemsql.New(db, sqldialect.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	o := &obsHarness{metrics: obs.NewMetrics(), locks: &faultLocks{Backend: &memlock.Backend{}}, logs: &lockedBuffer{}}
	o.keys = &faultKeys{KeyStore: backends.TimeKeys(o.metrics, keys)}
	store := sqlstore.Open(db, sqldialect.SQLite)
	store.Observe = o.metrics.DBObserver()
	store.Records = o.keys
	if ping == nil {
		ping = db.PingContext
	}
	logger := slog.New(slog.NewJSONHandler(o.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := harnessConfig{
		Config: httpapi.Config{
			Keys: o.keys, RequireToken: map[string]bool{"withdrawal": true}, Window: 10 * time.Second,
			KeyTTL: time.Hour, TokenTTL: time.Minute, Ping: ping, Components: comps, DeferKeys: true, TokenKey: []byte("obs-harness-submit-token-key-32b"),
			Metrics: o.metrics, Logger: logger,
		},
		App: app.Config{
			Currency: "CNY", MaxAmount: money.Amount(1_000_000_00), SessionTTL: time.Hour, LockTTL: 10 * time.Second,
			Locks:       lock.New(o.locks, &lock.Options{AutoRenew: true, Observe: o.metrics.LockObserver(func() string { return "memory" })}),
			LockBackend: func() string { return "memory" },
			Logger:      logger, Metrics: o.metrics,
		},
		Provider: obs.Provider{Provider: &psp.Sim{}, Metrics: o.metrics},
		Store:    store,
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	cfg.App.Store, cfg.App.Provider = cfg.Store, psp.Port(cfg.Provider)
	if cfg.WrapStore != nil {
		cfg.App.Store = cfg.WrapStore(cfg.Store)
	}
	cfg.Config.App = app.New(cfg.App)
	o.h = httpapi.New(cfg.Config)
	if code, _, _ := o.call("POST", "/api/v1/users", "", `{"username":"alice","password":"correct horse"}`); code != 201 {
		t.Fatalf("sign up = %d", code)
	}
	code, out, _ := o.call("POST", "/api/v1/sessions", "", `{"username":"alice","password":"correct horse"}`)
	if o.token, _ = out["token"].(string); code != 201 || o.token == "" {
		t.Fatalf("sign in = %d %v", code, out)
	}
	return o
}

// call sends a request as alice (once signed in) and returns the status,
// the JSON answer and the request id.
func (o *obsHarness) call(method, path, key, body string) (int, map[string]any, string) {
	w := serveJSON(o.h, o.token, method, path, key, body)
	out := map[string]any{}
	_ = json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out, w.Header().Get("X-Request-Id")
}

// value is the metric's sample with exactly these labels (0 when absent).
func (o *obsHarness) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	fams, err := o.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, kv []string) bool {
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if len(got) != len(kv)/2 {
		return false
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if got[kv[i]] != kv[i+1] {
			return false
		}
	}
	return true
}

// lines returns the JSON log lines whose msg is msg.
func (o *obsHarness) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(o.logs.String()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		if line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// fundedToken deposits 100 for the harness's user and returns a fresh
// withdrawal submit token.
func (o *obsHarness) fundedToken(t *testing.T) string {
	t.Helper()
	if code, _, _ := o.call("POST", "/api/v1/deposits", "dep-1", `{"amount":"100"}`); code != 201 {
		t.Fatalf("deposit = %d", code)
	}
	code, out, _ := o.call("POST", "/api/v1/submit-tokens", "", `{"purpose":"withdrawal"}`)
	tok, _ := out["token"].(string)
	if code != 201 || tok == "" {
		t.Fatalf("submit token = %d %v", code, out)
	}
	return tok
}

// A lock backend that does not answer: the withdrawal is 503 busy, the
// acquire counted unavailable and logged on the request's line; its key's
// record, created in the debit's transaction (Deferred), was never made,
// so its submit token was never bound: neither consumed nor released, the
// outcome "unrecorded". The retry with the same token runs, and a lease
// found gone at its release is counted lost and logged with the retry's
// request id; the token is consumed then.
func TestLockFailuresObserved(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	tok := o.fundedToken(t)

	o.locks.unavailable.Store(true)
	code, out, id1 := o.call("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	if code != 503 || out["code"] != "busy" {
		t.Fatalf("withdrawal with the locks down = %d %v; want 503 busy", code, out)
	}
	if v := o.value(t, "onceguard_lock_acquires_total", "backend", "memory", "result", "unavailable"); v != 1 {
		t.Errorf("lock_acquires_total{unavailable} = %v; want 1", v)
	}
	if c, r := o.value(t, "onceguard_submit_tokens_total", "outcome", "consumed"), o.value(t, "onceguard_submit_tokens_total", "outcome", "released"); c != 0 || r != 0 {
		t.Errorf("submit tokens consumed %v, released %v; want 0 and 0 (the 503 came before the token was bound)", c, r)
	}
	if v := o.value(t, "onceguard_idempotency_outcomes_total", "outcome", "unrecorded"); v != 1 {
		t.Errorf("idempotency_outcomes_total{unrecorded} = %v; want 1", v)
	}
	failed := o.lines(t, "lock acquire failed")
	if len(failed) != 1 || failed[0]["request_id"] != id1 || failed[0]["backend"] != "memory" || failed[0]["result"] != "unavailable" || failed[0]["lock"] == nil {
		t.Errorf("lock acquire failed lines = %v; want one, with request_id %s, backend memory, result unavailable", failed, id1)
	}

	o.locks.unavailable.Store(false)
	o.locks.loseAtRelease.Store(true)
	code, out, id2 := o.call("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	if code != 201 || out["status"] != "succeeded" {
		t.Fatalf("the same token again = %d %v; want 201 succeeded (the token was freed)", code, out)
	}
	if v := o.value(t, "onceguard_lock_lost_total", "backend", "memory"); v != 1 {
		t.Errorf("lock_lost_total = %v; want 1", v)
	}
	if c, r := o.value(t, "onceguard_submit_tokens_total", "outcome", "consumed"), o.value(t, "onceguard_submit_tokens_total", "outcome", "released"); c != 1 || r != 0 {
		t.Errorf("submit tokens consumed %v, released %v; want 1 and 0", c, r)
	}
	lost := o.lines(t, "lock lost")
	if len(lost) != 1 || lost[0]["request_id"] != id2 || id2 == id1 || lost[0]["backend"] != "memory" || !strings.Contains(fmt.Sprint(lost[0]["cause"]), "expired") {
		t.Errorf("lock lost lines = %v; want one, with request_id %s, backend memory and the cause", lost, id2)
	}
	// The database calls of the key store are timed too.
	// (Signed submit tokens are minted with no write: no token_put.)
	for _, op := range []string{"key_begin", "key_complete_tx"} { // the retry, finished moments ago here, is looked up in the store (Begin)
		if v := o.value(t, "onceguard_db_duration_seconds", "op", op); v == 0 {
			t.Errorf("db_duration_seconds{op=%q} has no samples", op)
		}
	}
}

// A release that does not reach the lock backend is not a lost lock:
// nothing ended the lease while it was held, and the backend lets it go
// when its TTL passes. It is logged "lock release failed" (with the cause
// and the result unavailable), never "lock lost", and lock_lost_total
// does not count it. A release that finds the lock someone else's, or
// expired, is a lease lost while held: "lock lost", counted.
func TestLockReleaseFailureNotLost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*faultLocks) *atomic.Bool
		lost  bool
		cause string
	}{
		{"release unreachable", func(f *faultLocks) *atomic.Bool { return &f.unreachableAtRelease }, false, "backend unavailable"},
		{"release finds another owner", func(f *faultLocks) *atomic.Bool { return &f.stolenAtRelease }, true, "not held"},
		{"release finds it expired", func(f *faultLocks) *atomic.Bool { return &f.loseAtRelease }, true, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newObsHarness(t, nil, nil)
			tok := o.fundedToken(t)
			tc.fault(o.locks).Store(true)
			code, out, id := o.call("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
			if code != 201 || out["status"] != "succeeded" {
				t.Fatalf("withdrawal = %d %v; want 201 succeeded (the write was done under the lock)", code, out)
			}
			if v := o.value(t, "onceguard_lock_hold_seconds", "backend", "memory"); v != 1 {
				t.Errorf("lock_hold_seconds samples = %v; want 1 (the release)", v)
			}
			lostLines, failed := o.lines(t, "lock lost"), o.lines(t, "lock release failed")
			lostCount := o.value(t, "onceguard_lock_lost_total", "backend", "memory")
			if !tc.lost {
				if lostCount != 0 || len(lostLines) != 0 {
					t.Errorf("a release that did not reach the backend: lock_lost_total = %v, lock lost lines %v; want 0 and none", lostCount, lostLines)
				}
				if len(failed) != 1 || failed[0]["request_id"] != id || failed[0]["backend"] != "memory" || failed[0]["level"] != "WARN" ||
					failed[0]["result"] != "unavailable" || failed[0]["lock"] == nil ||
					!strings.Contains(fmt.Sprint(failed[0]["cause"]), tc.cause) || strings.Contains(fmt.Sprint(failed[0]["cause"]), "lease lost") {
					t.Errorf("lock release failed lines = %v; want one WARN, with request_id %s, backend memory, result unavailable and the backend's error as the cause", failed, id)
				}
				return
			}
			if lostCount != 1 || len(failed) != 0 {
				t.Errorf("a lease lost at its release: lock_lost_total = %v, lock release failed lines %v; want 1 and none", lostCount, failed)
			}
			if len(lostLines) != 1 || lostLines[0]["request_id"] != id || lostLines[0]["level"] != "WARN" || !strings.Contains(fmt.Sprint(lostLines[0]["cause"]), tc.cause) {
				t.Errorf("lock lost lines = %v; want one WARN, with request_id %s and the cause (%q)", lostLines, id, tc.cause)
			}
		})
	}
}

// A key store that does not answer: 503 store_unavailable, counted.
func TestStoreUnavailableObserved(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	o.keys.down.Store(true)
	code, out, _ := o.call("POST", "/api/v1/deposits", "dep-1", `{"amount":"1"}`)
	if code != 503 || out["code"] != "store_unavailable" {
		t.Fatalf("deposit with the key store down = %d %v; want 503 store_unavailable", code, out)
	}
	if v := o.value(t, "onceguard_idempotency_outcomes_total", "outcome", "store_unavailable"); v != 1 {
		t.Errorf("idempotency_outcomes_total{store_unavailable} = %v; want 1", v)
	}
	if v := o.value(t, "onceguard_money_movements_total", "kind", "deposit", "outcome", "succeeded"); v != 0 {
		t.Errorf("money moved with the key store down: %v", v)
	}
}

// /readyz: 503 unavailable without the database; 200 degraded with an
// unhealthy component; "not configured" is healthy.
func TestReadyz(t *testing.T) {
	var dbDown, providerDown atomic.Bool
	comps := []httpapi.Component{
		{Name: "redis", Check: func(context.Context) (string, bool) { return "not configured", true }},
		{Name: "locks", Check: func(context.Context) (string, bool) { return "memory", true }},
		{Name: "provider", Check: func(context.Context) (string, bool) {
			if providerDown.Load() {
				return "unreachable", false
			}
			return "ok", true
		}},
	}
	o := newObsHarness(t, comps, func(context.Context) error {
		if dbDown.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	for _, tc := range []struct {
		name           string
		db, provider   bool // down
		code           int
		status, dbWant string
	}{
		{"all up", false, false, 200, "ok", "ok"},
		{"provider down", false, true, 200, "degraded", "ok"},
		{"database down", true, false, 503, "unavailable", "unreachable"},
	} {
		dbDown.Store(tc.db)
		providerDown.Store(tc.provider)
		code, out, _ := o.call("GET", "/readyz", "", "")
		c, _ := out["components"].(map[string]any)
		want := map[string]any{"database": tc.dbWant, "redis": "not configured", "locks": "memory", "provider": "ok"}
		if tc.provider {
			want["provider"] = "unreachable"
		}
		if code != tc.code || out["status"] != tc.status || fmt.Sprint(c) != fmt.Sprint(want) {
			t.Errorf("%s: readyz = %d %v; want %d %s with %v", tc.name, code, out, tc.code, tc.status, want)
		}
	}
}

// reconcilerFirst is a provider after whose every call the reconciler
// settles the movement before the request does: the request's own
// settlement then moves nothing.
type reconcilerFirst struct {
	psp.Provider
	store *sqlstore.Store
}

func (p reconcilerFirst) Do(ctx context.Context, kind psp.Kind, key string, amount money.Amount) (psp.Operation, error) {
	op, err := p.Provider.Do(ctx, kind, key, amount)
	if err == nil && kind == psp.Charge {
		_, err = p.store.SettleDeposit(ctx, key, op.Status == psp.Succeeded, time.Now())
	}
	return op, err
}

// One audit line per money movement: a deposit the reconciler settled
// while its request waited on the provider gets the reconciler's line,
// not a second one from the request, which still answers 201 succeeded.
func TestAuditOncePerMovement(t *testing.T) {
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) {
		c.Provider = reconcilerFirst{Provider: c.Provider, store: c.Store}
	})
	code, out, _ := o.call("POST", "/api/v1/deposits", "dep-1", `{"amount":"5.00"}`)
	if code != 201 || out["status"] != "succeeded" {
		t.Fatalf("deposit = %d %v; want 201 succeeded", code, out)
	}
	if _, acct, _ := o.call("GET", "/api/v1/account", "", ""); acct["balance"] != "5.00" {
		t.Errorf("balance = %v; want 5.00 (credited once)", acct["balance"])
	}
	if n := strings.Count(o.logs.String(), `"msg":"money"`); n != 0 {
		t.Errorf("the request wrote %d audit lines for a deposit the reconciler settled; want 0 (the reconciler writes it)", n)
	}
	// A deposit the request settles itself still gets its line.
	o2 := newObsHarness(t, nil, nil)
	if code, _, _ := o2.call("POST", "/api/v1/deposits", "dep-1", `{"amount":"5.00"}`); code != 201 {
		t.Fatalf("deposit = %d", code)
	}
	if n := strings.Count(o2.logs.String(), `"msg":"money"`); n != 1 {
		t.Errorf("audit lines = %d; want 1", n)
	}
}

// serveJSON sends h a JSON request as the holder of token (none when
// empty), under Idempotency-Key key (none when empty), and returns the
// recorded answer.
func serveJSON(h http.Handler, token, method, path, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
