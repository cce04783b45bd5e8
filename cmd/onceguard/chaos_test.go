package main

// Chaos: storms of money requests while the network between the service
// and its Redis, its PostgreSQL and its payment provider misbehaves on
// command (internal/faultproxy), each run checked afterwards by one
// checker, chaosCheck:
//
//   - every (user, key) moved money at most once: each key's 201 answers
//     name one id, no two keys name the same id, and every listed deposit,
//     withdrawal, order and payment is some key's answer (at most one per
//     key that never had a definite answer), listed once;
//   - after retrying what was not definite with its own key, every key
//     ends once, and the same key again replays the same answer;
//   - no balance below zero, every ledger sums to its balance, each entry's
//     balance_after follows from the one before, one entry per movement;
//   - the provider's charges and payouts match the service's deposits and
//     withdrawals one to one (looked up by the movement's id; counts and
//     sums), with nothing left pending once the reconciler ran;
//   - no request got a 500 or no answer: only 201, 409, 422, 429 and the
//     503s the scenario's fault may cause, with the contract's codes and
//     Retry-After.
//
// The scenarios (TestChaos): Redis slow (latency below, then beyond the
// service's 500 ms Redis timeout), Redis black-holed, Redis restarted
// twice (every lock lost while held), PostgreSQL's connections reset, and
// a provider that times out after (and before) it moved the money. Each
// runs on a fresh PostgreSQL database and a Redis server of its own, both
// reached through a proxy, and on a simulated provider served over HTTP
// behind a third proxy; they skip without ONCEGUARD_TEST_POSTGRES or
// redis-server. Each logs one line: requests sent, faults injected,
// invariants checked, violations.
//
// TestChaosCheckerCatches shows the checker finds what it is for, against
// a fake service broken one way at a time. TestChaosPostgresResetIsUnavailable
// and TestChaosRefusalNotStoredRunsAgain pin the causes of what the
// db-reset scenario finds.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// chaosConfig is what a scenario changes.
type chaosConfig struct {
	name  string   // the database is onceguard_chaos_<name>
	flags []string // service flags beyond --db, --redis, --psp, --reconcile-interval
	// tokens: withdrawals use submit tokens (--require-submit-token
	// withdrawal), else plain keys everywhere (none).
	tokens bool
	// allow503 are the 503 codes the scenario's fault may answer; nil: a
	// 503 is a violation ("a Redis outage never fails a request").
	allow503 map[string]bool
}

// chaosEnv is one scenario's world: the service, its dependencies, the
// proxies between them, and the history of every request.
type chaosEnv struct {
	t                 *testing.T
	cfg               chaosConfig
	base              string
	logs              *syncBuffer
	sim               *psp.Sim
	redis             *redistest.Server
	redisP, dbP, pspP *faultproxy.Proxy
	hc                *http.Client
	users             []*chaosUser
	seed              uint64
	began             time.Time // when the scenario began

	sent     atomic.Int64 // requests sent, all phases
	answered atomic.Int64 // storm requests answered (or failed)
	created  atomic.Int64 // storm requests answered 201

	mu     sync.Mutex
	ops    []*chaosOp
	others []chaosAnswer // answers to submit-token requests
	faults []string      // what was injected, for the summary

	stop      chan struct{}
	stopOnce  sync.Once
	stormDone sync.WaitGroup

	// violation reports a violated invariant; nil: t.Errorf. Tests of
	// the checker set it, and reconcileWait (default 20 s), how long the
	// checker waits for pending movements to settle.
	violation     func(format string, args ...any)
	reconcileWait time.Duration
}

type chaosUser struct {
	name, token string
	keys        atomic.Int64 // keys the storm made for the user

	mu     sync.Mutex
	orders []chaosOrder // created (201) orders, for payments
}

type chaosOrder struct {
	id     string
	amount money.Amount
}

// chaosOp is one keyed request: sent once or more (storm duplicates,
// retries, replays), always with the same key and body.
type chaosOp struct {
	user   *chaosUser
	kind   string // deposit, withdrawal, order, payment
	path   string
	key    string
	body   string
	amount money.Amount
	order  string // payments: the order's id

	mu      sync.Mutex
	answers []chaosAnswer
}

func (op *chaosOp) String() string {
	return fmt.Sprintf("%s %s key %s %s", op.user.name, op.kind, op.key, op.body)
}

// chaosAnswer is what one request got.
type chaosAnswer struct {
	phase      string // storm, settle, replay
	status     int
	code       string
	id         string // the created movement's or order's id; a payment's payment_id
	amount     string
	state      string // the body's "status"
	replayed   bool
	retryAfter string
	raw        string
	err        error // no answer
	took       time.Duration
}

func (a chaosAnswer) String() string {
	if a.err != nil {
		return fmt.Sprintf("%s: no answer after %v: %v", a.phase, a.took.Round(time.Millisecond), a.err)
	}
	return fmt.Sprintf("%s: %d %s %s", a.phase, a.status, a.code, strings.TrimSpace(a.raw))
}

// definite: an answer the client does not retry with the same key.
func (a chaosAnswer) definite() bool {
	switch {
	case a.err != nil, a.status >= 500:
		return false
	case a.status == 409 && (a.code == "request_in_progress" || a.code == "payment_in_progress"):
		return false
	}
	return true
}

// outcome is what a definite answer says happened, comparable across the
// answers to one key ("201 wd_..", "422 insufficient_funds").
func (a chaosAnswer) outcome() string {
	if a.status == 201 {
		return "201 " + a.id
	}
	return fmt.Sprint(a.status, " ", a.code)
}

// --- setting up ---

func startChaos(t *testing.T, cfg chaosConfig) *chaosEnv {
	t.Helper()
	if os.Getenv("ONCEGUARD_TEST_POSTGRES") == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set; skipping the chaos test")
	}
	redistest.RequireBinaries(t)
	e := &chaosEnv{t: t, cfg: cfg, sim: &psp.Sim{}, stop: make(chan struct{}), seed: uint64(time.Now().UnixNano()), began: time.Now()}
	proxy := func(target string) *faultproxy.Proxy {
		p, err := faultproxy.Start(target)
		if err != nil {
			t.Fatalf("faultproxy.Start(%s) = %v", target, err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}

	// PostgreSQL, through a proxy.
	dbURL, err := url.Parse(dbtest.FreshPostgres(t, "onceguard_chaos_"+strings.ReplaceAll(cfg.name, "-", "_")))
	if err != nil {
		t.Fatal(err)
	}
	e.dbP = proxy(dbURL.Host)
	dbURL.Host = e.dbP.Addr()

	// Redis of our own, through a proxy.
	e.redis = redistest.StartServer(t)
	e.redisP = proxy(e.redis.Addr())

	// The provider: a psp.Sim over HTTP, through a proxy. An injected
	// timeout makes psp.Handler hang until the client gives up (the
	// service's client waits 10 s); TimeoutHandler cuts it after 300 ms
	// with a 503, which the service's client reads, like a transport
	// timeout, as an unknown outcome.
	pspSrv := httptest.NewServer(http.TimeoutHandler(psp.Handler(e.sim), 300*time.Millisecond, "provider timed out"))
	t.Cleanup(pspSrv.Close)
	e.pspP = proxy(pspSrv.Listener.Addr().String())

	require := "none"
	if cfg.tokens {
		require = "withdrawal"
	}
	e.base, e.logs = chaosServe(t, append([]string{"--db", dbURL.String(), "--redis", "redis://" + e.redisP.Addr() + "/0",
		"--psp", "http://" + e.pspP.Addr(), "--reconcile-interval", "100ms", "--require-submit-token", require}, cfg.flags...)...)
	e.hc = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(e.hc.CloseIdleConnections)
	t.Cleanup(e.endStorm) // before the service stops (cleanups run last first)

	for i := range 3 {
		c := signUp(t, e.base, fmt.Sprintf("chaos%d", i))
		e.users = append(e.users, &chaosUser{name: fmt.Sprintf("chaos%d", i), token: c.token})
	}
	// The opening balance, as keyed deposits of the history. The storm
	// takes out about twice what it puts in: balances run near zero, and
	// withdrawals and payments race for what is left.
	for i, u := range e.users {
		op := e.newOp(u, "deposit", "/api/v1/deposits", fmt.Sprintf("open-%d", i), 50_00, "")
		if a := e.run(op, "storm"); a.status != 201 || a.state != "succeeded" {
			t.Fatalf("opening deposit = %v; want 201 succeeded", a)
		}
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		f, err := os.CreateTemp("", "onceguard-chaos-"+cfg.name+"-*.log")
		if err == nil {
			_, _ = f.WriteString(e.logs.String())
			_ = f.Close()
			t.Logf("seed %d; the service's whole log is in %s; its errors:\n%s", e.seed, f.Name(), chaosLogTail(e.logs.String()))
		} else {
			t.Logf("seed %d; service log (errors):\n%s", e.seed, chaosLogTail(e.logs.String()))
		}
	})
	return e
}

// chaosServe is startServe with the service's log kept (JSON), for the
// report of a failed run.
func chaosServe(t *testing.T, extra ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json"}, extra...)
	go func() { done <- run(ctx, args, func(string) string { return "" }, out, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve after cancel = %v; want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("serve did not stop within 20 s of its context's end")
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		if i := strings.Index(out.String(), "http://"); i >= 0 {
			return strings.TrimSuffix(strings.Fields(out.String()[i:])[0], ";"), logs
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v; output %q %q", err, out, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not say where it listens: %q", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// chaosLogTail is the service log's errors and 500s (not its warnings:
// every 503 is one), at most 40 lines.
func chaosLogTail(log string) string {
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"status":500`) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 40 {
		lines = append(lines[:20], append([]string{"..."}, lines[len(lines)-20:]...)...)
	}
	return strings.Join(lines, "\n")
}

// --- requests ---

func (e *chaosEnv) newOp(u *chaosUser, kind, path, key string, amount money.Amount, order string) *chaosOp {
	body := fmt.Sprintf(`{"amount":%q}`, amount)
	switch kind {
	case "order":
		body = fmt.Sprintf(`{"amount":%q,"description":"chaos"}`, amount)
	case "payment":
		body = `{"method":"wallet"}`
	}
	op := &chaosOp{user: u, kind: kind, path: path, key: key, body: body, amount: amount, order: order}
	u.keys.Add(1)
	e.mu.Lock()
	e.ops = append(e.ops, op)
	e.mu.Unlock()
	return op
}

// send is one request, without t: storms send from many goroutines.
func (e *chaosEnv) send(u *chaosUser, method, path, key, body string) chaosAnswer {
	e.sent.Add(1)
	start := time.Now()
	var a chaosAnswer
	req, err := http.NewRequest(method, e.base+path, strings.NewReader(body))
	if err != nil {
		return chaosAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+u.token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return chaosAnswer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a = chaosAnswer{status: resp.StatusCode, raw: string(raw), err: err, took: time.Since(start),
		replayed: resp.Header.Get("Idempotent-Replayed") == "true", retryAfter: resp.Header.Get("Retry-After")}
	var b map[string]any
	_ = json.Unmarshal(raw, &b)
	str := func(k string) string { s, _ := b[k].(string); return s }
	a.code, a.amount, a.state, a.id = str("code"), str("amount"), str("status"), str("id")
	if pid := str("payment_id"); pid != "" && str("order_id") != "" {
		a.id = pid // a payment's answer; a paid order names its payment too, but is the order
	}
	return a
}

// run sends op and records its answer.
func (e *chaosEnv) run(op *chaosOp, phase string) chaosAnswer {
	a := e.send(op.user, "POST", op.path, op.key, op.body)
	a.phase = phase
	op.mu.Lock()
	op.answers = append(op.answers, a)
	op.mu.Unlock()
	if phase == "storm" {
		e.answered.Add(1)
		if a.status == 201 {
			e.created.Add(1)
		}
	}
	if op.kind == "order" && a.status == 201 && !a.replayed {
		op.user.mu.Lock()
		op.user.orders = append(op.user.orders, chaosOrder{a.id, op.amount})
		op.user.mu.Unlock()
	}
	return a
}

// --- the storm ---

// startStorm runs workers per user until endStorm: withdrawals, deposits,
// orders and payments of the user's recent orders (several keys racing for
// one order), each under a fresh key, and some of them sent twice at once
// under the same key.
func (e *chaosEnv) startStorm(workersPerUser int) {
	e.t.Logf("storm seed %d, after %v of setting up", e.seed, time.Since(e.began).Round(time.Millisecond))
	for ui, u := range e.users {
		for w := range workersPerUser {
			e.stormDone.Add(1)
			go func() {
				defer e.stormDone.Done()
				r := rand.New(rand.NewPCG(e.seed, uint64(ui*100+w)))
				for n := 0; ; n++ {
					select {
					case <-e.stop:
						return
					default:
					}
					op := e.nextOp(u, r, fmt.Sprintf("%d-%d", w, n))
					if op == nil {
						continue
					}
					var a chaosAnswer
					if r.IntN(100) < 15 { // the same key twice at once
						var twin sync.WaitGroup
						twin.Add(1)
						go func() {
							defer twin.Done()
							e.run(op, "storm")
						}()
						a = e.run(op, "storm")
						twin.Wait()
					} else {
						a = e.run(op, "storm")
					}
					if a.status >= 500 { // back off a little, as a client would
						time.Sleep(50 * time.Millisecond)
					}
				}
			}()
		}
	}
}

// chaosMaxKeys bounds the keys of one user, so that every movement and
// ledger entry fits the API's lists (the newest 1000).
const chaosMaxKeys = 600

func (e *chaosEnv) nextOp(u *chaosUser, r *rand.Rand, seq string) *chaosOp {
	if u.keys.Load() >= chaosMaxKeys {
		time.Sleep(10 * time.Millisecond)
		return nil
	}
	cents := func(lo, hi int) money.Amount { return money.Amount(lo + r.IntN(hi-lo)) }
	switch p := r.IntN(100); {
	case p < 40:
		key := "wd-" + seq
		if e.cfg.tokens {
			a := e.send(u, "POST", "/api/v1/submit-tokens", "", `{"purpose":"withdrawal"}`)
			a.phase = "storm"
			e.mu.Lock()
			e.others = append(e.others, a)
			e.mu.Unlock()
			var b struct {
				Token string `json:"token"`
			}
			if a.status != 201 || json.Unmarshal([]byte(a.raw), &b) != nil || b.Token == "" {
				time.Sleep(20 * time.Millisecond)
				return nil
			}
			key = b.Token
		}
		return e.newOp(u, "withdrawal", "/api/v1/withdrawals", key, cents(1_00, 20_00), "")
	case p < 60:
		return e.newOp(u, "deposit", "/api/v1/deposits", "dep-"+seq, cents(2_00, 20_00), "")
	case p < 75:
		return e.newOp(u, "order", "/api/v1/orders", "ord-"+seq, cents(1_00, 10_00), "")
	default:
		u.mu.Lock()
		var o chaosOrder
		if n := len(u.orders); n > 0 {
			o = u.orders[max(0, n-1-r.IntN(3))] // one of the last three: payments race
		}
		u.mu.Unlock()
		if o.id == "" {
			return nil
		}
		return e.newOp(u, "payment", "/api/v1/orders/"+o.id+"/payment", "pay-"+seq, o.amount, o.id)
	}
}

// waitStorm waits until the storm has answered n more requests (or failed
// to get an answer), at most limit.
func (e *chaosEnv) waitStorm(n int64, limit time.Duration) {
	e.t.Helper()
	want := e.answered.Load() + n
	deadline := time.Now().Add(limit)
	for e.answered.Load() < want {
		if time.Now().After(deadline) || e.saturated() {
			e.t.Logf("the storm answered %d of %d requests within %v", n-(want-e.answered.Load()), n, limit)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// saturated: every user has all the keys the storm makes.
func (e *chaosEnv) saturated() bool {
	for _, u := range e.users {
		if u.keys.Load() < chaosMaxKeys {
			return false
		}
	}
	return true
}

// endStorm stops the workers and waits for their requests.
func (e *chaosEnv) endStorm() {
	e.stopOnce.Do(func() { close(e.stop) })
	e.stormDone.Wait()
}

// fault records what is injected, then injects it.
func (e *chaosEnv) fault(what string, inject func()) {
	e.t.Helper()
	e.mu.Lock()
	e.faults = append(e.faults, what)
	e.mu.Unlock()
	inject()
}

func (e *chaosEnv) heal(ps ...*faultproxy.Proxy) {
	e.t.Helper()
	for _, p := range ps {
		if err := p.Heal(); err != nil {
			e.t.Fatalf("Heal() = %v", err)
		}
	}
}

// readyz is GET /readyz: its status code and body status.
func (e *chaosEnv) readyz() (int, string, string) {
	resp, err := e.hc.Get(e.base + "/readyz")
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var b struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(raw, &b)
	return resp.StatusCode, b.Status, string(raw)
}

// waitReady waits until /readyz says ok (the lock breaker is back on
// Redis), at most limit.
func (e *chaosEnv) waitReady(limit time.Duration) {
	e.t.Helper()
	start := time.Now()
	for deadline := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		code, status, raw := e.readyz()
		if code == 200 && status == "ok" {
			e.t.Logf("readyz ok again after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			e.t.Errorf("readyz = %d %s; want 200 ok within %v of healing", code, raw, limit)
			return
		}
	}
}

// --- the checker ---

// chaosCheck ends the scenario's storm, retries every key without a
// definite answer under its own key and body (as a client would), waits
// for the reconciler, sends every key once more (a replay), then checks
// the invariants on the history, the service's lists, ledgers and
// balances, and the provider's records, and logs one summary line. Each
// violated invariant is reported with e.violation (t.Errorf unless a test
// of the checker set it); it returns how many invariants it checked and
// how many were violated.
func chaosCheck(t *testing.T, e *chaosEnv) (checked, violations int) {
	t.Helper()
	report := e.violation
	if report == nil {
		report = t.Errorf
	}
	check := func(ok bool, format string, args ...any) bool {
		t.Helper()
		checked++
		if !ok {
			violations++
			if violations <= 40 {
				report(format, args...)
			} else if violations == 41 {
				report("more violations follow; not shown")
			}
		}
		return ok
	}
	begin := time.Now()
	e.endStorm()
	stormRequests := e.sent.Load()
	e.mu.Lock()
	ops := append([]*chaosOp(nil), e.ops...)
	others := append([]chaosAnswer(nil), e.others...)
	faults, nFaults := chaosFaultList(e.faults), len(e.faults)
	e.mu.Unlock()
	last := func(op *chaosOp) chaosAnswer {
		op.mu.Lock()
		defer op.mu.Unlock()
		return op.answers[len(op.answers)-1]
	}

	// 1. Settle: every key to a definite answer, under its own key and
	// body, after Retry-After (at most 200 ms: the fault is healed).
	chaosEach(ops, 32, func(op *chaosOp) {
		for deadline := time.Now().Add(30 * time.Second); !last(op).definite() && time.Now().Before(deadline); {
			wait := 100 * time.Millisecond
			if s, err := strconv.Atoi(last(op).retryAfter); err == nil && s > 0 {
				wait = min(time.Duration(s)*time.Second, 200*time.Millisecond)
			}
			time.Sleep(wait)
			e.run(op, "settle")
		}
	})

	// 2. The reconciler settles what the provider left pending.
	pending := func() (n int) {
		for _, u := range e.users {
			for _, table := range []string{"deposits", "withdrawals"} {
				for _, m := range e.list(u, table) {
					if m.Status == "pending" {
						n++
					}
				}
			}
		}
		return n
	}
	reconcileWait := e.reconcileWait
	if reconcileWait == 0 {
		reconcileWait = 20 * time.Second
	}
	for deadline := time.Now().Add(reconcileWait); pending() > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}

	// 3. Replays: the same key again gets the stored answer (a 429 is not
	// stored).
	chaosEach(ops, 32, func(op *chaosOp) {
		if a := last(op); a.definite() && a.status != 429 {
			e.run(op, "replay")
		}
	})

	// 4. Every answer: one of the contract's, with Retry-After where it
	// wants one; no 500, no 503 the fault does not explain, no silence.
	allowed := map[string]map[string]bool{
		"deposit":    {"201 ": true, "409 request_in_progress": true},
		"withdrawal": {"201 ": true, "409 request_in_progress": true, "422 insufficient_funds": true, "429 duplicate_submission": true},
		"order":      {"201 ": true, "409 request_in_progress": true, "429 duplicate_submission": true},
		"payment": {"201 ": true, "409 request_in_progress": true, "409 payment_in_progress": true, "409 order_already_paid": true,
			"422 insufficient_funds": true},
	}
	statuses := map[string]int{}
	var slowest time.Duration
	for _, op := range ops {
		for _, a := range op.answers {
			slowest = max(slowest, a.took)
			code := fmt.Sprint(a.status, " ", a.code)
			if a.status == 201 && a.state == "pending" {
				code = "201 pending"
			}
			statuses[code]++
			switch {
			case !check(a.err == nil, "%v: %v; want an answer", op, a):
			case !check(a.took < chaosMaxLatency, "%v: %v after %v; want an answer within %v (the service's own timeouts: a lock is waited for 5 s, Redis 500 ms a call)",
				op, a, a.took.Round(time.Millisecond), chaosMaxLatency):
			case a.status == 503:
				check(e.cfg.allow503[a.code], "%v: %v; want no 503 %s under this fault", op, a, a.code)
				check(a.retryAfter != "", "%v: %v without Retry-After", op, a)
			default:
				check(allowed[op.kind][fmt.Sprint(a.status, " ", a.code)], "%v: %v; want only the contract's answers (201, 409, 422, 429)", op, a)
				if a.status == 429 || a.code == "request_in_progress" || a.code == "payment_in_progress" {
					check(a.retryAfter != "", "%v: %v without Retry-After", op, a)
				}
			}
		}
	}
	for _, a := range others { // submit tokens
		ok := a.err == nil && (a.status == 201 || a.status == 503 && e.cfg.allow503[a.code])
		check(ok, "POST /api/v1/submit-tokens: %v; want 201 (or a 503 this fault allows)", a)
		statuses[fmt.Sprint("token ", a.status, " ", a.code)]++
	}

	// 5. Each key: definite in the end, one outcome however often it was
	// sent, one id, no id for two keys, and replays byte for byte.
	byID := map[string]*chaosOp{} // a 201's id -> its key
	paidBy := map[string][]string{}
	var undecided, reruns, advanced int
	for _, op := range ops {
		outcomes := map[string]bool{}
		var runs []string // bodies of the key's answers that were not replays
		for _, a := range op.answers {
			if a.definite() && !a.replayed {
				runs = append(runs, a.raw)
			}
		}
		for _, a := range op.answers {
			if !a.definite() || a.status == 429 {
				continue
			}
			outcomes[a.outcome()] = true
			if a.status == 201 {
				check(a.amount == op.amount.String(), "%v: %v; want amount %s", op, a, op.amount)
			}
			switch {
			case a.phase != "replay":
			case !a.replayed:
				// The key's answer was sent but could not be stored (the
				// database failed just then): after its lease the key ran
				// again and found its movement. Same outcome (checked
				// below), not a replay.
				reruns++
			case len(runs) == 0 || slices.Contains(runs, a.raw):
			case slices.ContainsFunc(runs, func(run string) bool { return chaosSettledSince(run, a.raw) }):
				// Counted, not a violation: the run answered pending and
				// the replay says how the movement settled. The commit
				// that settled it (storing the key's answer in the same
				// transaction) lost its acknowledgement to a reset, so
				// the service answered pending, not knowing.
				advanced++
				t.Logf("%v: the replay %s says how the pending answer %q settled", op, strings.TrimSpace(a.raw), runs)
			default:
				check(false, "%v: replay %v; want one of the key's answers %q byte for byte", op, a, runs)
			}
		}
		if !check(last(op).definite(), "%v: answers %v; want a definite answer after retries", op, op.answers) {
			undecided++
		}
		check(len(outcomes) <= 1, "%v: answers %v; want one outcome per key", op, op.answers)
		id := chaosOpID(op)
		if id == "" {
			continue
		}
		if other, dup := byID[id]; check(!dup, "%s answered to two keys: %v and %v", id, other, op) {
			byID[id] = op
		}
		if op.kind == "payment" {
			paidBy[op.order] = append(paidBy[op.order], id)
		}
	}

	// 6. The service's records: each listed id is a key's answer, listed
	// once; one ledger entry per movement; the books balance; each order
	// paid at most once.
	var charges, payouts struct {
		n   int
		sum money.Amount
	}
	for _, u := range e.users {
		listed := map[string]chaosMovement{} // id -> the item (its status)
		listedKind := map[string]string{}
		var want money.Amount           // the balance the movements make
		unexplained := map[string]int{} // per kind: listed, but no key's 201
		orderStatus := map[string]string{}
		for _, table := range []string{"deposits", "withdrawals", "orders"} {
			kind := strings.TrimSuffix(table, "s")
			for _, m := range e.list(u, table) {
				_, twice := listed[m.ID]
				check(!twice, "%s: %s listed twice", u.name, m.ID)
				listed[m.ID], listedKind[m.ID] = m, kind
				if op := byID[m.ID]; op == nil || op.kind != kind || op.user != u {
					unexplained[kind]++
				} else {
					check(m.Amount == op.amount.String(), "%s: %s %+v; want amount %s (%v)", u.name, kind, m, op.amount, op)
				}
				a, _ := money.Parse(m.Amount)
				switch {
				case kind == "order":
					orderStatus[m.ID] = m.Status
				case kind == "deposit" && m.Status == "succeeded":
					want += a
					charges.n++
					charges.sum += a
				case kind == "withdrawal" && m.Status != "failed":
					want -= a
					payouts.n++
					payouts.sum += a
				}
				if kind != "order" {
					check(m.Status == "succeeded" || m.Status == "failed", "%s: %s %+v still %s after waiting %v for the reconciler", u.name, kind, m, m.Status, reconcileWait)
					e.checkProvider(check, u, kind, m)
				}
			}
		}
		// A listed movement no answer produced is allowed only for a key
		// that never got a definite answer (itself a violation above),
		// one per key.
		for kind, n := range unexplained {
			check(n <= undecided, "%s: %d %ss listed that no key's answer produced; want none", u.name, n, kind)
		}
		for _, op := range ops {
			if id := chaosOpID(op); op.user == u && op.kind != "payment" && id != "" {
				check(listedKind[id] == op.kind, "%s: %v answered %s, which GET /api/v1/%ss does not list", u.name, op, id, op.kind)
			}
		}

		// The ledger: one entry per movement of its kind, a chain of
		// balances that never goes below zero, summing to the balance.
		entries := e.ledger(u)
		refs := map[string]bool{}
		var sum money.Amount
		for i, l := range entries {
			check(!refs[l.Kind+" "+l.Ref], "%s: two ledger entries %s %s", u.name, l.Kind, l.Ref)
			refs[l.Kind+" "+l.Ref] = true
			sum += l.amount
			check(l.balanceAfter >= 0, "%s: ledger entry %+v below zero", u.name, l)
			check(l.balanceAfter == sum, "%s: ledger entry %d %+v: balance_after %s; want %s (the entries before it plus its amount)", u.name, i, l, l.balanceAfter, sum)
			m := listed[l.Ref]
			switch l.Kind {
			case "payment":
				op := byID[l.Ref]
				if check(op != nil && op.kind == "payment" && op.user == u, "%s: ledger payment %s that no key's answer produced", u.name, l.Ref) {
					check(-l.amount == op.amount, "%s: ledger payment %+v; want -%s", u.name, l, op.amount)
					want -= op.amount
				}
			case "deposit":
				check(listedKind[l.Ref] == "deposit" && m.Status == "succeeded" && l.amount.String() == m.Amount,
					"%s: ledger entry %+v; want a succeeded deposit's credit (listed: %+v)", u.name, l, m)
			case "withdrawal":
				check(listedKind[l.Ref] == "withdrawal" && (-l.amount).String() == m.Amount,
					"%s: ledger entry %+v; want a withdrawal's debit (listed: %+v)", u.name, l, m)
			case "withdrawal_refund":
				check(listedKind[l.Ref] == "withdrawal" && m.Status == "failed" && l.amount.String() == m.Amount,
					"%s: ledger entry %+v; want a failed withdrawal's refund (listed: %+v)", u.name, l, m)
			default:
				check(false, "%s: ledger entry of kind %q", u.name, l.Kind)
			}
		}
		for id, m := range listed {
			switch kind := listedKind[id]; {
			case kind == "deposit" && m.Status == "succeeded":
				check(refs["deposit "+id], "%s: deposit %+v succeeded without a ledger entry", u.name, m)
			case kind == "withdrawal":
				check(refs["withdrawal "+id], "%s: withdrawal %+v without a ledger entry", u.name, m)
				check(refs["withdrawal_refund "+id] == (m.Status == "failed"), "%s: withdrawal %+v: refunded %v; want a refund exactly when failed", u.name, m, refs["withdrawal_refund "+id])
			}
		}
		balance := e.balance(u)
		check(balance >= 0, "%s: balance %s below zero", u.name, balance)
		check(sum == balance, "%s: ledger sums to %s; want the balance %s", u.name, sum, balance)
		check(balance == want, "%s: balance %s; want %s (succeeded deposits - withdrawals not failed - payments)", u.name, balance, want)
		for id, st := range orderStatus {
			n := len(paidBy[id])
			check(n <= 1, "%s: order %s paid by %d keys: %v", u.name, id, n, paidBy[id])
			check((st == "paid") == (n == 1), "%s: order %s is %s with %d payments answered", u.name, id, st, n)
		}
		for _, op := range ops {
			if id := chaosOpID(op); op.user == u && op.kind == "payment" && id != "" {
				check(refs["payment "+id], "%s: payment %s answered but not in the ledger", u.name, id)
			}
		}
	}

	// 7. The provider moved exactly what the service records: one charge
	// per succeeded deposit, one payout per withdrawal not failed (each
	// also looked up by its id above).
	n, sum := e.sim.Moved(psp.Charge)
	check(n == charges.n && sum == charges.sum, "provider charged %d, %s; want %d, %s (the succeeded deposits)", n, sum, charges.n, charges.sum)
	n, sum = e.sim.Moved(psp.Payout)
	check(n == payouts.n && sum == payouts.sum, "provider paid out %d, %s; want %d, %s (the withdrawals not failed)", n, sum, payouts.n, payouts.sum)

	t.Logf("chaos %s: %d requests sent (%d in the storm, %d keys), %d faults injected (%s); %d invariants checked, %d violations; "+
		"answers %v, slowest %v; %d keys ran again for want of a stored answer, %d replays told how a pending answer settled; checked in %v",
		e.cfg.name, e.sent.Load(), stormRequests, len(ops), nFaults, faults, checked, violations,
		statuses, slowest.Round(time.Millisecond), reruns, advanced, time.Since(begin).Round(time.Millisecond))
	return checked, violations
}

// chaosMaxLatency bounds every answer: longer is a hang.
const chaosMaxLatency = 10 * time.Second

// chaosFaultList summarises faults in order, repeats counted.
func chaosFaultList(faults []string) string {
	var order []string
	count := map[string]int{}
	for _, f := range faults {
		if count[f] == 0 {
			order = append(order, f)
		}
		count[f]++
	}
	for i, f := range order {
		if count[f] > 1 {
			order[i] = fmt.Sprintf("%s (%d times)", f, count[f])
		}
	}
	return strings.Join(order, "; ")
}

// chaosSettledSince reports whether the movement answer replay is run
// (both JSON) with its status moved from pending to a settled one.
func chaosSettledSince(run, replay string) bool {
	var a, b map[string]any
	if json.Unmarshal([]byte(run), &a) != nil || json.Unmarshal([]byte(replay), &b) != nil || a["status"] != "pending" {
		return false
	}
	if b["status"] != "succeeded" && b["status"] != "failed" {
		return false
	}
	a["status"] = b["status"]
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// chaosOpID is the id of op's 201, or "".
func chaosOpID(op *chaosOp) string {
	for _, a := range op.answers {
		if a.status == 201 && a.definite() {
			return a.id
		}
	}
	return ""
}

// checkProvider: the provider's operation under the movement's id is of
// its kind and amount, and succeeded or failed as the service says.
func (e *chaosEnv) checkProvider(check func(bool, string, ...any) bool, u *chaosUser, kind string, m chaosMovement) {
	op, err := e.sim.Lookup(context.Background(), m.ID)
	wantKind := map[string]psp.Kind{"deposit": psp.Charge, "withdrawal": psp.Payout}[kind]
	check(err == nil && op.Kind == wantKind && op.Amount.String() == m.Amount && string(op.Status) == m.Status,
		"%s: %s %+v; the provider's operation under its id is %+v, %v; want a %s of %s, %s", u.name, kind, m, op, err, wantKind, m.Amount, m.Status)
}

// chaosEach runs f for every op, n at a time.
func chaosEach(ops []*chaosOp, n int, f func(*chaosOp)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, op := range ops {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(op)
		}()
	}
	wg.Wait()
}

// get is a GET the checker needs answered: it fails the test otherwise.
func (e *chaosEnv) get(u *chaosUser, path string, v any) {
	e.t.Helper()
	a := e.send(u, "GET", path, "", "")
	if a.err != nil || a.status != 200 {
		e.t.Fatalf("GET %s = %v", path, a)
	}
	if err := json.Unmarshal([]byte(a.raw), v); err != nil {
		e.t.Fatalf("GET %s: %v (%s)", path, err, a.raw)
	}
}

// chaosMovement is an item of GET /api/v1/{deposits,withdrawals,orders}.
type chaosMovement struct {
	ID     string `json:"id"`
	Amount string `json:"amount"`
	Status string `json:"status"`
}

// chaosAmount parses an amount as the API writes it, with an optional
// minus sign (ledger debits).
func chaosAmount(s string) (money.Amount, error) {
	a, err := money.Parse(strings.TrimPrefix(s, "-"))
	if strings.HasPrefix(s, "-") {
		a = -a
	}
	return a, err
}

func (e *chaosEnv) list(u *chaosUser, table string) []chaosMovement {
	e.t.Helper()
	var l struct {
		Items []chaosMovement `json:"items"`
	}
	e.get(u, "/api/v1/"+table, &l)
	return l.Items
}

type chaosLedgerEntry struct {
	ID           string `json:"id"`
	Kind         string `json:"kind"`
	Amount       string `json:"amount"`
	BalanceAfter string `json:"balance_after"`
	Ref          string `json:"ref"`

	amount, balanceAfter money.Amount
}

// ledger is the user's ledger, oldest first, amounts parsed.
func (e *chaosEnv) ledger(u *chaosUser) []chaosLedgerEntry {
	e.t.Helper()
	var l struct {
		Items []chaosLedgerEntry `json:"items"`
	}
	e.get(u, "/api/v1/ledger", &l)
	for i := range l.Items {
		it := &l.Items[i]
		var err1, err2 error
		it.amount, err1 = chaosAmount(it.Amount)
		it.balanceAfter, err2 = chaosAmount(it.BalanceAfter)
		if err1 != nil || err2 != nil {
			e.t.Fatalf("ledger entry %+v: %v %v", it, err1, err2)
		}
	}
	sort.Slice(l.Items, func(i, j int) bool {
		a, _ := strconv.ParseInt(l.Items[i].ID, 10, 64)
		b, _ := strconv.ParseInt(l.Items[j].ID, 10, 64)
		return a < b
	})
	return l.Items
}

func (e *chaosEnv) balance(u *chaosUser) money.Amount {
	e.t.Helper()
	var acct struct {
		Balance string `json:"balance"`
	}
	e.get(u, "/api/v1/account", &acct)
	b, err := chaosAmount(acct.Balance)
	if err != nil {
		e.t.Fatalf("balance %q: %v", acct.Balance, err)
	}
	return b
}

// --- the scenarios ---

// TestChaos runs the storms under faults one after the other (each
// alone on the machine, so that timeouts are the fault's, not the CPU's).
func TestChaos(t *testing.T) {
	t.Run("redis-slow", testChaosRedisSlow)
	t.Run("redis-blackhole", testChaosRedisBlackhole)
	t.Run("redis-restart", testChaosRedisRestart)
	t.Run("db-reset", testChaosDBReset)
	t.Run("provider-timeout", testChaosProviderTimeout)
}

// Redis slow: first 200 ms each way (a 400 ms round trip, just inside the
// service's 500 ms Redis timeout: slow, and whatever takes longer trips
// the fallback), then 300 ms (every call beyond it: the locks fall back to
// the database). Redis is not the client's problem: no 503 at all, and
// requests keep succeeding. The repeat window is on (in Redis, then in the
// database).
func testChaosRedisSlow(t *testing.T) {
	e := startChaos(t, chaosConfig{name: "redis-slow", flags: []string{"--lock-ttl", "2s", "--key-lease", "10s"}})
	e.startStorm(3)
	e.waitStorm(20, 10*time.Second)
	e.fault("Redis +200ms each way for 1.5s", func() { e.redisP.SetLatency(200 * time.Millisecond) })
	e.succeeding(1500 * time.Millisecond)
	e.fault("Redis +300ms each way for 1.5s", func() { e.redisP.SetLatency(300 * time.Millisecond) })
	e.succeeding(1500 * time.Millisecond)
	e.heal(e.redisP)
	e.waitReady(10 * time.Second)
	e.waitStorm(20, 10*time.Second)
	chaosCheck(t, e)
}

// Redis black-holed: connections accepted, nothing answered. Requests keep
// succeeding on the database's locks within the service's timeouts (no
// 503), /readyz says degraded, and after healing the service returns to
// Redis.
func testChaosRedisBlackhole(t *testing.T) {
	e := startChaos(t, chaosConfig{name: "redis-blackhole", flags: []string{"--lock-ttl", "2s", "--key-lease", "10s"}})
	e.startStorm(3)
	e.waitStorm(20, 10*time.Second)
	e.fault("Redis black-holed for 2s", e.redisP.Blackhole)
	start := time.Now()
	for {
		code, status, raw := e.readyz()
		if code == 200 && status == "degraded" {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Errorf("readyz with Redis black-holed = %d %s; want 200 degraded within 3 s", code, raw)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.succeeding(max(2*time.Second-time.Since(start), 500*time.Millisecond))
	e.heal(e.redisP)
	e.waitReady(10 * time.Second)
	e.waitStorm(20, 10*time.Second)
	chaosCheck(t, e)
}

// Redis restarted mid-storm, twice: every lock and window entry in it is
// lost while their holders still work (the database is 5 ms away each
// way, so holders hold a while). Withdrawals use submit tokens. No 503:
// the fences and the database's constraints keep the money right, and the
// stale-fence retries keep the clients out of it.
func testChaosRedisRestart(t *testing.T) {
	e := startChaos(t, chaosConfig{name: "redis-restart", tokens: true, flags: []string{"--lock-ttl", "2s", "--key-lease", "10s", "--repeat-window", "0"}})
	e.fault("PostgreSQL +5ms each way throughout", func() { e.dbP.SetLatency(5 * time.Millisecond) })
	e.startStorm(3)
	for i := range 2 {
		e.waitStorm(20, 10*time.Second)
		// Restart only once Redis holds a lock: the restart must lose
		// locks while their holders work, or this case tests nothing.
		held, keys := heldRedisLocks(t, e.redis, 10*time.Second)
		if len(held) == 0 {
			t.Fatalf("restart %d: Redis held no lock in 10s of sampling the storm (last sample: %v keys): the restart would lose no lock", i+1, keys)
		}
		t.Logf("restart %d: Redis holds %d lock(s), e.g. %s, of %v keys", i+1, len(held), held[0], keys)
		e.fault("Redis restarted", func() { e.redis.Restart(t) })
		e.succeeding(time.Second)
		e.waitReady(10 * time.Second)
	}
	e.waitStorm(20, 10*time.Second)
	e.heal(e.dbP)
	chaosCheck(t, e)
}

// heldRedisLocks samples srv until it holds at least one lock (a lock's
// own key, "onceguard:lock:{K}", not its fence or queue, which outlive
// it) or limit passes, and returns the held locks' names and the key
// count of the last sample. A storm takes and releases locks all the
// time, so a sample can fall between holds; it is repeated every
// millisecond or so.
func heldRedisLocks(t *testing.T, srv *redistest.Server, limit time.Duration) (held []string, keys any) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; {
		keys, _ = srv.Do("DBSIZE")
		reply, err := srv.Do("KEYS", "onceguard:lock:*")
		if names, ok := reply.([]any); ok && err == nil {
			for _, n := range names {
				if name, _ := n.(string); strings.HasSuffix(name, "}") { // P{K}: the lock; P{K}:fence and the rest are not
					held = append(held, name)
				}
			}
		}
		if len(held) > 0 || time.Now().After(deadline) {
			return held, keys
		}
		time.Sleep(time.Millisecond)
	}
}

// PostgreSQL's connections reset mid-storm: eight short pulses (every
// open connection reset, and every new one for 100 ms; then, 150 ms later,
// the open ones once more), then every connection for a whole second.
// Answers may be 503 store_unavailable (never 500, never a double move);
// the checker retries them with the same key and checks every key ends
// once. Withdrawals use submit tokens, which a 503 must not burn.
func testChaosDBReset(t *testing.T) {
	e := startChaos(t, chaosConfig{name: "db-reset", tokens: true, flags: []string{"--lock-ttl", "2s", "--key-lease", "3s", "--repeat-window", "0"},
		allow503: map[string]bool{"store_unavailable": true}})
	e.startStorm(3)
	e.waitStorm(20, 10*time.Second)
	for range 8 {
		e.fault("PostgreSQL connections reset, new ones too, for 100ms", e.dbP.ResetUntilHeal)
		time.Sleep(100 * time.Millisecond)
		e.heal(e.dbP)
		time.Sleep(150 * time.Millisecond)
		e.fault("PostgreSQL open connections reset", e.dbP.Reset)
		e.waitStorm(10, 5*time.Second)
	}
	e.fault("PostgreSQL connections reset, new ones too, for 1s", e.dbP.ResetUntilHeal)
	e.during(time.Second)
	e.heal(e.dbP)
	e.waitStorm(20, 10*time.Second)
	chaosCheck(t, e)
}

// The provider times out after it moved the money (and sometimes before,
// or declines, or its connections are reset): the 201s say pending, the
// reconciler (every 100 ms) settles them by asking under the movement's
// id, and the provider's records match the service's one to one.
func testChaosProviderTimeout(t *testing.T) {
	e := startChaos(t, chaosConfig{name: "provider-timeout", flags: []string{"--lock-ttl", "2s", "--key-lease", "10s", "--repeat-window", "0"}})
	e.startStorm(3)
	e.waitStorm(20, 10*time.Second)
	for i := range 10 {
		e.fault("provider times out after commit ×2", func() { e.sim.Inject(psp.TimeoutAfterCommit, psp.TimeoutAfterCommit) })
		switch i {
		case 3:
			e.fault("provider times out before commit", func() { e.sim.Inject(psp.TimeoutBeforeCommit) })
		case 5:
			e.fault("provider declines", func() { e.sim.Inject(psp.Decline) })
		case 7:
			e.fault("provider connections reset", e.pspP.Reset)
		}
		e.during(200 * time.Millisecond)
	}
	e.waitStorm(20, 10*time.Second)
	chaosCheck(t, e)
	pending := 0
	for _, op := range e.ops {
		for _, a := range op.answers {
			if a.status == 201 && a.state == "pending" {
				pending++
			}
		}
	}
	if pending == 0 {
		t.Errorf("no answer said pending: the provider's timeouts never reached a request")
	}
}

// during lets the storm run for d, logs how many requests it answered
// meanwhile, and returns how many of them were 201s.
func (e *chaosEnv) during(d time.Duration) int64 {
	e.t.Helper()
	answered, created := e.answered.Load(), e.created.Load()
	time.Sleep(d)
	answered, created = e.answered.Load()-answered, e.created.Load()-created
	e.t.Logf("%d answers in %v, %d of them 201", answered, d.Round(time.Millisecond), created)
	return created
}

// succeeding lets the storm run for d under a Redis fault and checks that
// requests kept succeeding meanwhile: Redis is not the client's problem.
func (e *chaosEnv) succeeding(d time.Duration) {
	e.t.Helper()
	if created := e.during(d); created == 0 {
		e.t.Errorf("no request succeeded in %v under the Redis fault; want them to go on, on the database's locks", d)
	}
	code, _, raw := e.readyz()
	e.t.Logf("readyz: %d %s", code, strings.TrimSpace(raw))
}

// --- the checker, checked ---

// chaosFake is a service that answers from tables: each keyed POST with
// its list of answers (the n-th call gets the n-th, the last repeats; an
// answer given before comes with Idempotent-Replayed: true), and the GETs
// the checker reads. Tests of the checker break one thing in it.
type chaosFake struct {
	mu      sync.Mutex
	answers map[string][]chaosFakeAnswer // "path key" -> answers
	calls   map[string]int
	gets    map[string]string // path -> body
}

type chaosFakeAnswer struct {
	status int
	body   string // "" with status 0: close the connection unanswered
}

func (f *chaosFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	if r.Method == "GET" {
		defer f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, f.gets[r.URL.Path])
		return
	}
	k := r.URL.Path + " " + r.Header.Get("Idempotency-Key")
	as := f.answers[k]
	n := f.calls[k]
	f.calls[k]++
	f.mu.Unlock()
	if len(as) == 0 {
		http.Error(w, "no such key in the fake", http.StatusTeapot)
		return
	}
	a := as[min(n, len(as)-1)]
	if a.status == 0 { // silence, past the client's timeout
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-r.Context().Done():
		}
		return
	}
	// After a stored answer, what comes is a replay (of it, or, in a
	// broken fake, of something else).
	if n > 0 {
		if prev := as[min(n-1, len(as)-1)]; prev.status > 0 && prev.status < 500 {
			w.Header().Set("Idempotent-Replayed", "true")
		}
	}
	if a.status == 503 || a.status == 409 {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_, _ = io.WriteString(w, a.body)
}

// The checker catches what it is for: against a fake service whose
// history and books are right it finds nothing; with one thing broken
// at a time (a double move, an id answered to two keys, books that do
// not balance, a provider that paid twice, a 500, ...) it reports that.
func TestChaosCheckerCatches(t *testing.T) {
	mv := func(id, amount, status string) string {
		return fmt.Sprintf(`{"id":%q,"amount":%q,"status":%q,"created_at":"2026-01-01T00:00:00Z"}`, id, amount, status)
	}
	problem := func(status int, code string) chaosFakeAnswer {
		return chaosFakeAnswer{status, fmt.Sprintf(`{"type":"about:blank","title":"x","status":%d,"code":%q}`, status, code)}
	}
	paid := `{"order_id":"ord_1","payment_id":"pay_1","status":"paid","amount":"10.00"}`
	type op struct{ kind, path, key, amount, order string }
	ops := []op{
		{"deposit", "/api/v1/deposits", "d1", "100.00", ""},
		{"withdrawal", "/api/v1/withdrawals", "w1", "30.00", ""},
		{"withdrawal", "/api/v1/withdrawals", "w2", "500.00", ""},
		{"order", "/api/v1/orders", "o1", "10.00", ""},
		{"payment", "/api/v1/orders/ord_1/payment", "p1", "10.00", "ord_1"},
		{"payment", "/api/v1/orders/ord_1/payment", "p2", "10.00", "ord_1"},
		{"withdrawal", "/api/v1/withdrawals", "w3", "5.00", ""},
	}
	// The right world: 100 in, 30 out, an order of 10 paid once, 5 out
	// and refunded (declined), 500 refused.
	world := func() (*chaosFake, *psp.Sim) {
		f := &chaosFake{calls: map[string]int{}, answers: map[string][]chaosFakeAnswer{
			"/api/v1/deposits d1":             {{201, mv("dep_1", "100.00", "succeeded")}},
			"/api/v1/withdrawals w1":          {{201, mv("wd_1", "30.00", "succeeded")}},
			"/api/v1/withdrawals w2":          {problem(422, "insufficient_funds")},
			"/api/v1/orders o1":               {{201, `{"id":"ord_1","order_no":"ON1","amount":"10.00","description":"chaos","status":"created","created_at":"2026-01-01T00:00:00Z"}`}},
			"/api/v1/orders/ord_1/payment p1": {{201, paid}},
			"/api/v1/orders/ord_1/payment p2": {problem(409, "order_already_paid")},
			"/api/v1/withdrawals w3":          {{201, mv("wd_2", "5.00", "failed")}},
		}, gets: map[string]string{
			"/api/v1/deposits":    `{"items":[` + mv("dep_1", "100.00", "succeeded") + `]}`,
			"/api/v1/withdrawals": `{"items":[` + mv("wd_2", "5.00", "failed") + "," + mv("wd_1", "30.00", "succeeded") + `]}`,
			"/api/v1/orders":      `{"items":[` + mv("ord_1", "10.00", "paid") + `]}`,
			"/api/v1/ledger": `{"items":[
				{"id":"5","kind":"withdrawal_refund","amount":"5.00","balance_after":"60.00","ref":"wd_2"},
				{"id":"4","kind":"withdrawal","amount":"-5.00","balance_after":"55.00","ref":"wd_2"},
				{"id":"3","kind":"payment","amount":"-10.00","balance_after":"60.00","ref":"pay_1"},
				{"id":"2","kind":"withdrawal","amount":"-30.00","balance_after":"70.00","ref":"wd_1"},
				{"id":"1","kind":"deposit","amount":"100.00","balance_after":"100.00","ref":"dep_1"}]}`,
			"/api/v1/account": `{"balance":"60.00"}`,
		}}
		sim := &psp.Sim{}
		ctx := context.Background()
		_, _ = sim.Do(ctx, psp.Charge, "dep_1", 100_00)
		_, _ = sim.Do(ctx, psp.Payout, "wd_1", 30_00)
		sim.Inject(psp.Decline)
		_, _ = sim.Do(ctx, psp.Payout, "wd_2", 5_00)
		return f, sim
	}
	ledger := func(f *chaosFake, old, new string) {
		if !strings.Contains(f.gets["/api/v1/ledger"], old) {
			t.Fatalf("the fake's ledger has no %q", old)
		}
		f.gets["/api/v1/ledger"] = strings.Replace(f.gets["/api/v1/ledger"], old, new, 1)
	}
	for _, c := range []struct {
		name   string
		breaks func(*chaosFake, *psp.Sim)
		want   string // in some violation; "" for none
	}{
		{"nothing broken", func(*chaosFake, *psp.Sim) {}, ""},
		{"a withdrawal no key made", func(f *chaosFake, sim *psp.Sim) {
			f.gets["/api/v1/withdrawals"] = `{"items":[` + mv("wd_9", "5.00", "failed") + "," + mv("wd_2", "5.00", "failed") + "," + mv("wd_1", "30.00", "succeeded") + `]}`
		}, "withdrawals listed that no key's answer produced"},
		{"one id for two keys", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/withdrawals w3"] = []chaosFakeAnswer{{201, mv("wd_1", "5.00", "failed")}}
		}, "answered to two keys"},
		{"a key with two outcomes", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/withdrawals w2"] = []chaosFakeAnswer{problem(422, "insufficient_funds"), {201, mv("wd_3", "500.00", "succeeded")}}
		}, "want one outcome per key"},
		{"a replay that differs", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/deposits d1"] = []chaosFakeAnswer{{201, mv("dep_1", "100.00", "succeeded")}, {201, mv("dep_1", "100.00", "succeeded") + " "}}
		}, "byte for byte"},
		{"an answered withdrawal not listed", func(f *chaosFake, _ *psp.Sim) {
			f.gets["/api/v1/withdrawals"] = `{"items":[` + mv("wd_2", "5.00", "failed") + `]}`
		}, "does not list"},
		{"the ledger does not sum to the balance", func(f *chaosFake, _ *psp.Sim) {
			f.gets["/api/v1/account"] = `{"balance":"70.00"}`
		}, "ledger sums to 60.00; want the balance 70.00"},
		{"a balance below zero", func(f *chaosFake, _ *psp.Sim) {
			ledger(f, `"amount":"100.00","balance_after":"100.00"`, `"amount":"-100.00","balance_after":"-100.00"`)
		}, "below zero"},
		{"a broken balance chain", func(f *chaosFake, _ *psp.Sim) {
			ledger(f, `"balance_after":"55.00"`, `"balance_after":"56.00"`)
		}, "the entries before it plus its amount"},
		{"a withdrawal debited twice", func(f *chaosFake, _ *psp.Sim) {
			ledger(f, `{"id":"1",`, `{"id":"0","kind":"withdrawal","amount":"-30.00","balance_after":"-30.00","ref":"wd_1"},{"id":"1",`)
		}, "two ledger entries withdrawal wd_1"},
		{"a refund of a withdrawal that did not fail", func(f *chaosFake, _ *psp.Sim) {
			ledger(f, `"ref":"wd_2"}`, `"ref":"wd_1"}`)
		}, "want a failed withdrawal's refund"},
		{"the provider paid twice", func(_ *chaosFake, sim *psp.Sim) {
			_, _ = sim.Do(context.Background(), psp.Payout, "wd_1-again", 30_00)
		}, "provider paid out 2, 60.00; want 1, 30.00"},
		{"a deposit the provider never saw", func(f *chaosFake, sim *psp.Sim) {
			f.gets["/api/v1/deposits"] = `{"items":[` + mv("dep_1", "100.00", "succeeded") + "," + mv("dep_2", "1.00", "failed") + `]}`
		}, "the provider's operation under its id"},
		{"a 500", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/withdrawals w1"] = []chaosFakeAnswer{problem(500, "internal"), {201, mv("wd_1", "30.00", "succeeded")}}
		}, "want only the contract's answers"},
		{"a 503 the fault does not explain", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/withdrawals w1"] = []chaosFakeAnswer{problem(503, "busy"), {201, mv("wd_1", "30.00", "succeeded")}}
		}, "want no 503 busy under this fault"},
		{"no answer", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/withdrawals w1"] = []chaosFakeAnswer{{}, {201, mv("wd_1", "30.00", "succeeded")}}
		}, "want an answer"},
		{"an order paid twice", func(f *chaosFake, _ *psp.Sim) {
			f.answers["/api/v1/orders/ord_1/payment p2"] = []chaosFakeAnswer{{201, strings.Replace(paid, "pay_1", "pay_2", 1)}}
		}, "paid by 2 keys"},
		{"a pending withdrawal left pending", func(f *chaosFake, sim *psp.Sim) {
			f.gets["/api/v1/withdrawals"] = strings.Replace(f.gets["/api/v1/withdrawals"], `"succeeded"`, `"pending"`, 1)
		}, "still pending"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, sim := world()
			c.breaks(f, sim)
			srv := httptest.NewServer(f)
			defer srv.Close()
			var got []string
			u := &chaosUser{name: "fake", token: "t"}
			e := &chaosEnv{t: t, cfg: chaosConfig{name: "fake"}, base: srv.URL, sim: sim, hc: &http.Client{Timeout: time.Second},
				users: []*chaosUser{u}, stop: make(chan struct{}), reconcileWait: 200 * time.Millisecond,
				violation: func(format string, args ...any) { got = append(got, fmt.Sprintf(format, args...)) }}
			for _, o := range ops {
				a, err := money.Parse(o.amount)
				if err != nil {
					t.Fatal(err)
				}
				e.run(e.newOp(u, o.kind, o.path, o.key, a, o.order), "storm")
			}
			checked, violations := chaosCheck(t, e)
			found := c.want == "" && violations == 0
			for _, v := range got {
				found = found || c.want != "" && strings.Contains(v, c.want)
			}
			if !found || checked == 0 || violations != len(got) {
				t.Errorf("chaosCheck: %d checked, %d violations %q; want one saying %q", checked, violations, got, c.want)
			}
		})
	}
}

// The root of the 500s of the db-reset scenario, in the store alone:
// withdrawals in transactions (sqlstore.Store.Withdraw, the service's own
// code) while PostgreSQL's connections are reset. Every error must be one
// the service answers 503 store_unavailable (sqldb.Unavailable): the
// database did not answer, and a retry is safe. Anything else becomes a
// 500 internal (httpapi's storeProblem).
func TestChaosPostgresResetIsUnavailable(t *testing.T) {
	if os.Getenv("ONCEGUARD_TEST_POSTGRES") == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set; skipping the chaos test")
	}
	u, err := url.Parse(dbtest.FreshPostgres(t, "onceguard_chaos_store_reset"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(16)
	ctx := context.Background()
	if err := sqlstore.Migrate(ctx, db, sqldialect.Postgres); err != nil {
		t.Fatal(err)
	}
	store := sqlstore.Open(db, sqldialect.Postgres)
	if err := store.CreateUser(ctx, app.User{ID: "u_reset", Username: "reset", PasswordHash: "x", CreatedAt: time.UnixMicro(1)}, "CNY"); err != nil {
		t.Fatal(err)
	}
	dep, _, err := store.CreateDeposit(ctx, app.Movement{ID: "dep_reset", UserID: "u_reset", Key: "d", Amount: 1_000_000_00, CreatedAt: time.UnixMicro(1)})
	if err == nil {
		_, err = store.SettleDeposit(ctx, dep.ID, true, time.UnixMicro(2))
	}
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu    sync.Mutex
		wrong = map[string]int{} // "%T: %v" -> count
		calls atomic.Int64
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("wd_reset_%d_%d", w, i)
				_, _, err := store.Withdraw(ctx, app.Movement{ID: id, UserID: "u_reset", Key: id, Amount: 1, CreatedAt: time.Now()}, 0, nil)
				calls.Add(1)
				if err != nil && !sqldb.Unavailable(err) {
					mu.Lock()
					wrong[fmt.Sprintf("%T: %v", err, err)]++
					mu.Unlock()
				}
			}
		}()
	}
	for range 15 { // reset every connection, and new ones for 50 ms; then once more the open ones
		time.Sleep(60 * time.Millisecond)
		p.ResetUntilHeal()
		time.Sleep(50 * time.Millisecond)
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(40 * time.Millisecond)
		p.Reset()
	}
	close(stop)
	wg.Wait()
	t.Logf("%d withdrawals through %d connection resets", calls.Load(), p.Stats().Resets)
	for e, n := range wrong {
		t.Errorf("%d × Withdraw error %s: sqldb.Unavailable = false, so the service answers 500 internal; want true (503 store_unavailable: the connection was reset, a retry is safe)", n, e)
	}
}

// chaosFailingComplete is an idempotency store whose next Complete calls
// fail as a database that was just reset does.
type chaosFailingComplete struct {
	*memstore.Store
	failures atomic.Int64
}

func (s *chaosFailingComplete) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	if s.failures.Add(-1) >= 0 {
		return fmt.Errorf("%w: read tcp: connection reset by peer", idempotency.ErrUnavailable)
	}
	return s.Store.Complete(ctx, id, lease, resp, now)
}

// The other finding of the db-reset scenario ("want one outcome per
// key": a withdrawal's key answered 422 insufficient_funds, then, sent
// again, 201), pinned without a database: when storing a business
// refusal fails, idempotency.Middleware sends the refusal anyway and
// leaves the key in flight; after the lease the same key runs again and,
// the balance topped up meanwhile, moves money. The contract: "Business
// refusals ... are stored and replayed like successes: the same key
// always gets the same answer." A 201 is safe to send unstored (the
// business tables' unique constraints pin its outcome); a refusal wrote
// nothing that could.
func TestChaosRefusalNotStoredRunsAgain(t *testing.T) {
	store := &chaosFailingComplete{Store: &memstore.Store{}}
	store.failures.Store(1)
	var balance, runs atomic.Int64
	withdraw := idempotency.Middleware(idempotency.Config{Store: store, Lease: 50 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if balance.Add(-10_00) < 0 {
			balance.Add(10_00)
			idempotency.WriteProblem(w, &idempotency.Problem{Status: 422, Code: "insufficient_funds", Title: "Insufficient funds"})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":"wd_1","amount":"10.00","status":"succeeded"}`)
	}))
	send := func() (int, string) {
		req := httptest.NewRequest("POST", "/api/v1/withdrawals", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "w-1")
		rec := httptest.NewRecorder()
		withdraw.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	first, body := send() // the database fails as the refusal is stored
	switch first {
	case 503: // not stored, so not a definite answer: a retry may run again
		return
	case 422:
	default:
		t.Fatalf("first answer = %d %s; want 422 insufficient_funds (or 503, as the refusal could not be stored)", first, body)
	}
	balance.Store(100_00)              // the user tops up
	time.Sleep(100 * time.Millisecond) // past the key's lease
	if again, body := send(); again != first {
		t.Errorf("the same key again = %d %s (the handler ran %d times); want the refusal, %d, again: the key's first answer was definite. "+
			"Sending a refusal whose storing failed, the key left in flight, lets it become a withdrawal later; answer 503 and free the key instead",
			again, strings.TrimSpace(body), runs.Load(), first)
	}
}
