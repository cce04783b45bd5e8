package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/sqldb"
)

// After a small storm, /metrics counts what happened, and the logs carry a
// request id on every request's lines and never a raw key, token or
// password.
func TestServeObservability(t *testing.T) {
	logs := &syncBuffer{}
	base, stop := startServeLogs(t, logs, "--log-format", "json", "--log-level", "debug")
	defer stop()

	const password = "correct horse"
	alice := signUp(t, base, "alice")
	anon := &client{t: t, base: base}
	anon.expect(anon.do("POST", "/api/v1/sessions", "", `{"username":"alice","password":"wrong horse"}`), 401, "invalid_credentials")
	const depKey = "deposit-key-0123456789"
	alice.expect(alice.do("POST", "/api/v1/deposits", depKey, `{"amount":"100"}`), 201, "")
	tok := alice.submitToken("withdrawal")
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`) }()
	}
	wg.Wait()
	alice.expect(alice.do("POST", "/api/v1/withdrawals", alice.submitToken("withdrawal"), `{"amount":"10"}`), 429, "duplicate_submission")
	// Refusals: a key reused for another body, a forged token, and
	// alice's token sent by bob.
	alice.expect(alice.do("POST", "/api/v1/deposits", depKey, `{"amount":"99"}`), 422, "idempotency_key_reused")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "st_forged", `{"amount":"10"}`), 400, "submit_token_invalid")
	bob := signUp(t, base, "bob")
	bob.expect(bob.do("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`), 400, "submit_token_invalid")

	// A request id sent by the client is kept; the answer names it.
	req, _ := http.NewRequest("GET", base+"/api/v1/account", nil)
	req.Header.Set("Authorization", "Bearer "+alice.token)
	req.Header.Set("X-Request-Id", "trace-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got != "trace-42" {
		t.Errorf("X-Request-Id = %q; want the client's trace-42", got)
	}

	// Metrics.
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metrics := string(body)
	replays, _ := metricValue(metrics, "onceguard_idempotency_outcomes_total", map[string]string{"outcome": "replayed"})
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   func(float64) bool
		says   string
	}{
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "new"}, eq(2), "deposit and withdrawal"},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "duplicate_submission"}, eq(1), ""},
		{"onceguard_repeat_window_rejections_total", map[string]string{"route": "/api/v1/withdrawals"}, eq(1), ""},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "issued"}, eq(2), ""},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "offered"}, eq(13 - replays), "with each of the 13 withdrawal answers but the replays"},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "consumed"}, eq(1), ""},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "mismatch"}, eq(1), "the deposit key with another amount"},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "token_invalid"}, eq(1), "the forged token"},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "token_foreign"}, eq(1), "bob sending alice's token"},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "invalid"}, eq(1), ""},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "foreign"}, eq(1), ""},
		{"onceguard_db_duration_seconds_count", map[string]string{"op": "key_begin"}, atLeast(2), "the key store's calls timed: the deposits' records, and the withdrawals' retries"},
		{"onceguard_db_duration_seconds_count", map[string]string{"op": "key_start_tx"}, atLeast(1), "the withdrawal's record created in its transaction (Deferred)"},
		// The first withdrawal and each replay of its finished key (looked up in the debit's
		// transaction, Deferred) take the user's lock, the replays moving no money; the
		// duplicates that arrive while the first runs are refused 409 at once, the window's
		// duplicate 429 (the Guard knows the window its first claimed), and the forged token
		// and bob's by their signature, all before it.
		{"onceguard_lock_acquires_total", map[string]string{"backend": "memory", "result": "acquired"}, eq(1 + replays), "the withdrawal and the replays"},
		{"onceguard_lock_hold_seconds_count", map[string]string{"backend": "memory"}, eq(1 + replays), ""},
		{"onceguard_money_movements_total", map[string]string{"kind": "withdrawal", "outcome": "succeeded"}, eq(1), "debited once"},
		{"onceguard_money_movements_total", map[string]string{"kind": "deposit", "outcome": "succeeded"}, eq(1), ""},
		{"onceguard_db_duration_seconds_count", map[string]string{"op": "withdraw"}, eq(1 + replays), "the same transactions"},
		{"onceguard_provider_duration_seconds_count", map[string]string{"op": "payout", "result": "ok"}, eq(1), ""},
		{"onceguard_http_request_duration_seconds_count", map[string]string{"route": "/api/v1/deposits", "method": "POST"}, eq(2), "the deposit and its key reused"},
	} {
		v, ok := metricValue(metrics, c.name, c.labels)
		if !ok || !c.want(v) {
			t.Errorf("%s%v = %v (found %v); want %s", c.name, c.labels, v, ok, c.says)
		}
	}
	if v, ok := metricValue(metrics, "onceguard_db_duration_seconds_count", map[string]string{"op": "token_put"}); ok && v != 0 {
		t.Errorf("token_put timed %v times; want none: submit tokens are signed, minted with no write", v)
	}
	inflight, _ := metricValue(metrics, "onceguard_idempotency_outcomes_total", map[string]string{"outcome": "in_progress"})
	if replays+inflight != 9 {
		t.Errorf("replayed %v + in_progress %v; want the 9 duplicates of the token", replays, inflight)
	}
	created, _ := metricValue(metrics, "onceguard_http_requests_total", map[string]string{"route": "/api/v1/withdrawals", "method": "POST", "code": "201"})
	conflicts, _ := metricValue(metrics, "onceguard_http_requests_total", map[string]string{"route": "/api/v1/withdrawals", "method": "POST", "code": "409"})
	if created != 1+replays || conflicts != inflight {
		t.Errorf("withdrawal answers: %v 201, %v 409; want 1 + %v replays, and the %v in progress", created, conflicts, replays, inflight)
	}

	if err := stop(); err != nil {
		t.Fatalf("serve = %v", err)
	}

	// Logs: JSON lines; every line of a request has its request id; one
	// audit line per money movement; no secret in clear.
	text := logs.String()
	for _, secret := range []string{password, "wrong horse", depKey, tok, alice.token} {
		if strings.Contains(text, secret) {
			t.Errorf("the logs contain a secret in clear: %q", secret)
		}
	}
	var requests, audits int
	sawTrace := false
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		msg, _ := line["msg"].(string)
		id, _ := line["request_id"].(string)
		switch msg {
		case "listening", "shutting down: finishing in-flight requests":
			continue // the process's own lines
		case "request":
			requests++
			sawTrace = sawTrace || id == "trace-42"
		case "money":
			audits++
			if line["key_hash"] == "" || line["user_id"] == "" || line["amount"] == nil || line["outcome"] == nil {
				t.Errorf("audit line without who/what/amount/key/outcome: %s", sc.Text())
			}
		}
		if id == "" {
			t.Errorf("log line without a request id: %s", sc.Text())
		}
	}
	if requests < 16 || audits != 2 || !sawTrace {
		t.Errorf("%d request lines, %d audit lines, trace-42 seen %v; want one per request (≥ 16), 2 audits (deposit, withdrawal), and the client's id", requests, audits, sawTrace)
	}
}

// Pitfall 20: /metrics never names a key, a token, a user or a resource.
// After keyed requests with distinctive keys (a deposit, its replay and a
// reuse, an order, its payment, a submit token, a payment of an order id
// the client made up) and requests on distinctive paths, no key, no hash
// of one (full SHA-256 hex, the logs' short form, the record id), no user
// id or name, no order, payment or deposit id and no request id appears
// anywhere in the metrics text; the requests are counted by route pattern.
func TestServeMetricsNoSecrets(t *testing.T) {
	base := startServe(t)
	const username = "zqx_metrics_user_4b1d"
	alice := signUp(t, base, username)
	acct := alice.do("GET", "/api/v1/account", "", "")
	userID, _ := acct.body["user_id"].(string)
	if userID == "" {
		t.Fatalf("account = %s; want a user_id", acct.raw)
	}
	const (
		depKey   = "ZqDepositKey-5e7a1c9b-distinctive"
		orderKey = "ZqOrderKey-77aa91d0-distinctive"
		payKey   = "ZqPayKey-c3f1e2a8-distinctive"
		ghostKey = "ZqGhostKey-0b9d4e6f-distinctive"
		ghostID  = "zqghostorder9f3e1a7c"
		route    = "zq-secret-route-31337"
		trace    = "zqtrace-ff01ab23"
	)
	dep := alice.do("POST", "/api/v1/deposits", depKey, `{"amount":"100"}`)
	alice.expect(dep, 201, "")
	depID, _ := dep.body["id"].(string)
	if a := alice.do("POST", "/api/v1/deposits", depKey, `{"amount":"100"}`); a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("deposit replay = %d %s; want the stored 201", a.status, a.raw)
	}
	alice.expect(alice.do("POST", "/api/v1/deposits", depKey, `{"amount":"99"}`), 422, "idempotency_key_reused")
	ord := alice.do("POST", "/api/v1/orders", orderKey, `{"amount":"20.00","description":"zq tea"}`)
	alice.expect(ord, 201, "")
	orderID, _ := ord.body["id"].(string)
	orderNo, _ := ord.body["order_no"].(string)
	pay := alice.do("POST", "/api/v1/orders/"+orderID+"/payment", payKey, `{"method":"wallet"}`)
	alice.expect(pay, 201, "")
	paymentID, _ := pay.body["payment_id"].(string)
	alice.expect(alice.do("GET", "/api/v1/orders/"+orderID, "", ""), 200, "")
	alice.expect(alice.do("POST", "/api/v1/orders/"+ghostID+"/payment", ghostKey, `{"method":"wallet"}`), 404, "not_found")
	alice.expect(alice.do("GET", "/api/v1/orders/"+ghostID, "", ""), 404, "not_found")
	alice.expect(alice.do("GET", "/api/v1/"+route, "", ""), 404, "not_found")
	tok := alice.submitToken("withdrawal")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`), 201, "")
	req, _ := http.NewRequest("GET", base+"/api/v1/account", nil)
	req.Header.Set("Authorization", "Bearer "+alice.token)
	req.Header.Set("X-Request-Id", trace)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	for name, v := range map[string]string{"deposit id": depID, "order id": orderID, "order_no": orderNo, "payment id": paymentID} {
		if v == "" {
			t.Fatalf("no %s in the answers", name)
		}
	}

	m := scrape(t, base)
	// Not vacuous: the requests were counted, by route pattern.
	for _, labels := range []map[string]string{
		{"route": "/api/v1/orders/{id}/payment", "method": "POST", "code": "201"},
		{"route": "/api/v1/orders/{id}/payment", "method": "POST", "code": "404"},
		{"route": "/api/v1/orders/{id}", "method": "GET", "code": "200"},
		{"route": "/api/v1/deposits", "method": "POST", "code": "422"},
		{"route": "unmatched", "method": "GET", "code": "404"},
	} {
		if v, ok := metricValue(m, "onceguard_http_requests_total", labels); !ok || v < 1 {
			t.Errorf("onceguard_http_requests_total%v = %v (found %v); want at least 1", labels, v, ok)
		}
	}
	full := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	secrets := map[string]string{
		"user id": userID, "username": username, "session token": alice.token, "request id": trace,
		"deposit id": depID, "order id": orderID, "order_no": orderNo, "payment id": paymentID,
		"made-up order id": ghostID, "unknown path segment": route, "submit token": tok,
		"deposit record id": idempotency.RecordID(idempotency.Scope{Principal: userID, Method: "POST", Path: "/api/v1/deposits"}, depKey),
	}
	for name, key := range map[string]string{"deposit key": depKey, "order key": orderKey, "payment key": payKey, "made-up order's key": ghostKey, "submit token": tok} {
		secrets[name] = key
		secrets[name+"'s SHA-256"] = full(key) // for the token: its stored form, token.Hash
		secrets[name+"'s short hash"] = obs.Hash(key)
	}
	for name, s := range secrets {
		if s == "" {
			t.Fatalf("%s is empty", name)
		}
		if i := strings.Index(m, s); i >= 0 {
			line := m[strings.LastIndex(m[:i], "\n")+1:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			t.Errorf("/metrics contains the %s %q: %s", name, s, line)
		}
	}
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

func atLeast(want float64) func(float64) bool { return func(v float64) bool { return v >= want } }

// scrape returns the service's /metrics.
func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics = %d %s", resp.StatusCode, body)
	}
	return string(body)
}

// logLines decodes JSON log lines.
func logLines(t *testing.T, text string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		out = append(out, line)
	}
	return out
}

// /readyz on the embedded default names every component: the database,
// Redis (not configured), the locks (in process), the provider and the
// events (not configured); a provider that does not answer makes it
// degraded, still 200.
func TestServeReadyz(t *testing.T) {
	base := startServe(t)
	anon := &client{t: t, base: base}
	r := anon.do("GET", "/readyz", "", "")
	want := map[string]any{"database": "ok", "redis": "not configured", "locks": "memory", "provider": "ok", "events": "not configured"}
	if c, _ := r.body["components"].(map[string]any); r.status != 200 || r.body["status"] != "ok" || fmt.Sprint(c) != fmt.Sprint(want) {
		t.Errorf("readyz = %d %s; want 200 ok with components %v", r.status, r.raw, want)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	anon = &client{t: t, base: startServe(t, "--psp", dead)}
	r = anon.do("GET", "/readyz", "", "")
	if c, _ := r.body["components"].(map[string]any); r.status != 200 || r.body["status"] != "degraded" || c["provider"] != "unreachable" || c["database"] != "ok" {
		t.Errorf("readyz with the provider down = %d %s; want 200 degraded, provider unreachable", r.status, r.raw)
	}
}

// /readyz without its database: 503 unavailable, and ready again when it
// is back. PostgreSQL behind a proxy the test cuts.
func TestServeReadyzDatabaseDown(t *testing.T) {
	u, err := url.Parse(dbtest.FreshPostgres(t, "onceguard_e2e_readyz"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	anon := &client{t: t, base: startServe(t, "--db", u.String())}
	r := anon.do("GET", "/readyz", "", "")
	if c, _ := r.body["components"].(map[string]any); r.status != 200 || r.body["status"] != "ok" || c["locks"] != "database" || c["redis"] != "not configured" {
		t.Fatalf("readyz = %d %s; want 200 ok, locks database, redis not configured", r.status, r.raw)
	}
	p.Drop()
	p.Reset()
	r = anon.do("GET", "/readyz", "", "")
	if c, _ := r.body["components"].(map[string]any); r.status != 503 || r.body["status"] != "unavailable" || c["database"] != "unreachable" {
		t.Errorf("readyz with the database down = %d %s; want 503 unavailable, database unreachable", r.status, r.raw)
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r = anon.do("GET", "/readyz", "", ""); r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz after the database came back = %d %s; want 200", r.status, r.raw)
		}
	}
}

// With PostgreSQL or MySQL the locks are in the database: their calls are
// timed in db_duration_seconds (lock_*), with the key store's (key_*,
// token_*), and counted by backend "database".
func TestServeDatabaseLockMetrics(t *testing.T) {
	for name, db := range databases(t) {
		if name == "sqlite" {
			continue // locks in process
		}
		t.Run(name, func(t *testing.T) {
			base := startServe(t, db(t)...)
			alice := signUp(t, base, "alice")
			alice.expect(alice.do("POST", "/api/v1/deposits", "d", `{"amount":"10"}`), 201, "")
			alice.expect(alice.do("POST", "/api/v1/withdrawals", alice.submitToken("withdrawal"), `{"amount":"1"}`), 201, "")
			m := scrape(t, base)
			for _, c := range []struct {
				name   string
				labels map[string]string
			}{
				{"onceguard_db_duration_seconds_count", map[string]string{"op": "lock_acquire"}},
				{"onceguard_db_duration_seconds_count", map[string]string{"op": "lock_release"}},
				{"onceguard_db_duration_seconds_count", map[string]string{"op": "key_begin"}},
				{"onceguard_db_duration_seconds_count", map[string]string{"op": "key_complete_tx"}},
				{"onceguard_lock_acquires_total", map[string]string{"backend": "database", "result": "acquired"}},
			} {
				if v, ok := metricValue(m, c.name, c.labels); !ok || v < 1 {
					t.Errorf("%s%v = %v (found %v); want at least 1", c.name, c.labels, v, ok)
				}
			}
		})
	}
}

// The reconciler, seen from /metrics and the logs: a deposit whose charge
// timed out after the provider charged and a withdrawal whose payout
// timed out before it reached the provider stay pending while no
// reconciler runs; restarted on the same data with one, it settles the
// deposit succeeded (found at the provider) and the withdrawal failed
// (sent again under its id and declined): reconciler_settled_total counts
// one of each, reconciler_pending comes to 0, and the log has one audit
// line per movement with by=reconciler.
func TestServeReconcilerMetrics(t *testing.T) {
	sim := &psp.Sim{}
	front := httptest.NewServer(http.TimeoutHandler(psp.Handler(sim), time.Second, "provider timed out"))
	t.Cleanup(front.Close)
	dir := t.TempDir()

	base, stop := startServeLogs(t, io.Discard, "--data-dir", dir, "--psp", front.URL, "--reconcile-interval", "1h")
	t.Cleanup(func() { _ = stop() })
	alice := signUp(t, base, "alice")
	acct := alice.do("GET", "/api/v1/account", "", "")
	userID, _ := acct.body["user_id"].(string)
	alice.expect(alice.do("POST", "/api/v1/deposits", "d0", `{"amount":"100"}`), 201, "")
	sim.Inject(psp.TimeoutAfterCommit)
	dep := alice.do("POST", "/api/v1/deposits", "d1", `{"amount":"20"}`)
	sim.Inject(psp.TimeoutBeforeCommit)
	tok := alice.submitToken("withdrawal")
	wd := alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":"5"}`)
	depID, _ := dep.body["id"].(string)
	wdID, _ := wd.body["id"].(string)
	if dep.status != 201 || dep.body["status"] != "pending" || wd.status != 201 || wd.body["status"] != "pending" {
		t.Fatalf("deposit %d %s, withdrawal %d %s; want both 201 pending", dep.status, dep.raw, wd.status, wd.raw)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve = %v", err)
	}

	sim.Inject(psp.Decline) // for the withdrawal, sent again by the reconciler
	logs := &syncBuffer{}
	base, stop2 := startServeLogs(t, logs, "--data-dir", dir, "--psp", front.URL, "--reconcile-interval", "50ms", "--log-format", "json")
	t.Cleanup(func() { _ = stop2() })
	var m string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m = scrape(t, base)
		s, _ := metricValue(m, "onceguard_reconciler_settled_total", map[string]string{"result": "succeeded"})
		f, _ := metricValue(m, "onceguard_reconciler_settled_total", map[string]string{"result": "failed"})
		p, ok := metricValue(m, "onceguard_reconciler_pending", nil)
		if s == 1 && f == 1 && ok && p == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reconciler settled %v succeeded, %v failed, %v pending (found %v); want 1, 1, 0 within 30 s", s, f, p, ok)
		}
	}
	if v, _ := metricValue(m, "onceguard_reconciler_settled_total", map[string]string{"result": "still_pending"}); v != 0 {
		t.Errorf("reconciler_settled_total{still_pending} = %v; want 0", v)
	}
	alice.base = base
	for _, c := range []struct{ path, want string }{{"/api/v1/deposits/" + depID, "succeeded"}, {"/api/v1/withdrawals/" + wdID, "failed"}} {
		if a := alice.do("GET", c.path, "", ""); a.body["status"] != c.want {
			t.Errorf("GET %s = %s; want status %s", c.path, a.raw, c.want)
		}
	}
	if err := stop2(); err != nil {
		t.Fatalf("serve = %v", err)
	}
	want := map[string]string{
		depID: fmt.Sprintf("deposit %s 20.00 CNY %s succeeded", userID, obs.Hash("d1")),
		wdID:  fmt.Sprintf("withdrawal %s 5.00 CNY %s failed", userID, obs.Hash(tok)),
	}
	got := map[string]string{}
	for _, line := range logLines(t, logs.String()) {
		if line["msg"] != "money" || line["by"] != "reconciler" {
			continue
		}
		id := fmt.Sprint(line["id"])
		if _, dup := got[id]; dup {
			t.Errorf("two reconciler audit lines for %s", id)
		}
		got[id] = fmt.Sprint(line["kind"], " ", line["user_id"], " ", line["amount"], " ", line["currency"], " ", line["key_hash"], " ", line["outcome"])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reconciler audit lines = %v; want one per movement: %v", got, want)
	}
}

// metricValue finds the sample of name whose labels include want, in the
// Prometheus text format.
func metricValue(text, name string, want map[string]string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (len(rest) > 0 && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "} ")
			if end < 0 {
				continue
			}
			for _, kv := range strings.Split(rest[1:end], ",") {
				k, v, _ := strings.Cut(kv, "=")
				labels[k] = strings.Trim(v, `"`)
			}
			rest = rest[end+1:]
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

// The commit group histogram's last bound is the write gate's largest
// group: obs keeps its own copy of the limit (it imports no database package).
func TestSQLiteMaxGroupAgrees(t *testing.T) {
	if obs.SQLiteMaxGroup != sqldb.DefaultMaxGroup {
		t.Errorf("obs.SQLiteMaxGroup = %d; sqldb.DefaultMaxGroup = %d: change them together", obs.SQLiteMaxGroup, sqldb.DefaultMaxGroup)
	}
}
