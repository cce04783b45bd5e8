package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/webhook"
)

const callbackSecret = "whsec_callbacks_test"

// startPSP runs `onceguard psp` in process with args and returns its base
// URL; the test's end stops it (its settlements and callbacks too).
func startPSP(t *testing.T, args ...string) string {
	t.Helper()
	base, _ := startPSPStop(t, args...)
	return base
}

// startPSPStop is startPSP with a stop that returns once its settlements
// and callbacks have stopped.
func startPSPStop(t *testing.T, args ...string) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	args = append([]string{"psp", "--addr", "127.0.0.1:0", "--notify-secret", callbackSecret}, args...)
	go func() { done <- run(ctx, args, func(string) string { return "" }, out, io.Discard) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("psp after cancel = %v; want nil", err)
		}
	})
	t.Cleanup(stop)
	return listenURL(t, "psp", out, done, 10*time.Second), stop
}

// The provider stops at once and cleanly though a client holds a
// connection it never sent a request on (net/http's transport leaves
// one when another connection served the request it dialed it for).
func TestPSPStopsWithASilentConnection(t *testing.T) {
	t.Parallel()
	base, stop := startPSPStop(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	time.Sleep(50 * time.Millisecond) // the server has it: a new connection
	start := time.Now()
	stop() // fails the test when the shutdown returns an error
	if took := time.Since(start); took > 9*time.Second {
		t.Errorf("stop took %v", took)
	}
}

// relay stands between the provider and the service instances: it
// delivers every callback it gets copies times at once, spread over the
// instances, and answers the provider 204 when one copy got a 2xx, else
// the first copy's status (so the provider redelivers). It counts every
// copy's answer.
type relay struct {
	t       *testing.T
	targets []string
	copies  int
	hc      *http.Client

	mu        sync.Mutex
	statuses  map[int]int       // answer status -> copies
	events    map[string][]byte // event id -> its body, as the provider sent it
	delivered map[string]bool   // event ids a copy of which got a 2xx
	relayed   map[string]int    // event id -> deliveries from the provider fanned out
	inflight  int               // deliveries from the provider being fanned out
}

func newRelay(t *testing.T, copies int) *relay {
	return &relay{t: t, copies: copies, statuses: map[int]int{}, events: map[string][]byte{}, delivered: map[string]bool{}, relayed: map[string]int{},
		hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}}
}

func (rl *relay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev struct{ ID string }
	_ = json.Unmarshal(body, &ev)
	rl.mu.Lock()
	rl.events[ev.ID] = body
	targets := rl.targets
	rl.inflight++
	rl.mu.Unlock()
	statuses := rl.fanOut(targets, body, r.Header.Get(webhook.OnceguardHeader))
	rl.mu.Lock()
	rl.relayed[ev.ID]++
	rl.inflight--
	rl.mu.Unlock()
	for _, st := range statuses {
		if st/100 == 2 {
			rl.mu.Lock()
			rl.delivered[ev.ID] = true
			rl.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	w.WriteHeader(statuses[0])
}

// waitDelivered waits until n events were delivered and dups of them
// fanned out 5 times (notify_duplicate), none still in flight: the
// provider sends no more then.
func (rl *relay) waitDelivered(t *testing.T, n, dups int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		rl.mu.Lock()
		got, inflight, fived := len(rl.delivered), rl.inflight, 0
		for _, k := range rl.relayed {
			if k >= 5 {
				fived++
			}
		}
		rl.mu.Unlock()
		if got >= n && inflight == 0 && fived >= dups {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callbacks delivered, %d in flight, %d delivered 5 times; want %d, 0, %d", got, inflight, fived, n, dups)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fanOut sends body with signature sig copies times at once and returns the answers' statuses.
func (rl *relay) fanOut(targets []string, body []byte, sig string) []int {
	statuses := make([]int, rl.copies)
	var wg sync.WaitGroup
	for i := range rl.copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", targets[i%len(targets)]+"/api/v1/psp/notifications", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(webhook.OnceguardHeader, sig)
			resp, err := rl.hc.Do(req)
			if err != nil {
				statuses[i] = http.StatusBadGateway
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	rl.mu.Lock()
	defer rl.mu.Unlock()
	for _, st := range statuses {
		rl.statuses[st]++
	}
	return statuses
}

func (rl *relay) counts() map[int]int {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	out := map[int]int{}
	for k, v := range rl.statuses {
		out[k] = v
	}
	return out
}

// eventFor is the body of the event the provider sent about key.
func (rl *relay) eventFor(key string) []byte {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	for _, body := range rl.events {
		var ev struct{ Operation struct{ Key string } }
		if json.Unmarshal(body, &ev) == nil && ev.Operation.Key == key {
			return body
		}
	}
	return nil
}

// sign is the Onceguard-Signature of body at t under the test's secret.
func sign(body []byte, t time.Time) string {
	return webhook.Onceguard{}.Sign([]byte(callbackSecret), t, body)
}

// pspFault injects faults for the next callbacks or operations.
func pspFault(t *testing.T, pspURL string, faults ...string) {
	t.Helper()
	b, _ := json.Marshal(map[string][]string{"faults": faults})
	resp, err := http.Post(pspURL+"/v1/faults", "application/json", bytes.NewReader(b))
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("inject %v = %v, %v", faults, resp, err)
	}
	resp.Body.Close()
}

// pspStatus is the provider's status of the operation under key.
func pspStatus(t *testing.T, pspURL, key string) string {
	t.Helper()
	resp, err := http.Get(pspURL + "/v1/operations/" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var op struct{ Status string }
	_ = json.NewDecoder(resp.Body).Decode(&op)
	return op.Status
}

// waitSettled waits until the movement is no longer pending and returns its status.
func waitSettled(t *testing.T, c *client, table, id string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		a := c.do("GET", "/api/v1/"+table+"/"+id, "", "")
		if st, _ := a.body["status"].(string); st != "pending" && a.status == 200 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s still pending: %s", table, id, a.raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sumMetric sums a metric's sample with labels over the instances.
func sumMetric(t *testing.T, bases []string, name string, labels map[string]string) float64 {
	var total float64
	for _, b := range bases {
		v, _ := metricValue(scrape(t, b), name, labels)
		total += v
	}
	return total
}

// Callback storms (SQLite always, PostgreSQL and MySQL when their servers
// are named): the provider (async, or settling at once so that its
// answer races its callback) calls back through a relay that delivers
// every callback 20 times at once across the instances, one callback held
// back by notify_delay so that later ones overtake it, one delivered 5
// times at once, one first signed wrongly, and one withdrawal declined; the reconciler runs every 50ms, racing the callbacks. Then a
// stale "failed" for a succeeded deposit, 20 times at once. Every movement
// settles once, as the provider says; balances and ledgers are exact; the
// conflicts are counted, exactly.
func TestCallbackStorms(t *testing.T) {
	t.Run("sqlite/async", func(t *testing.T) { callbackStorm(t, nil, 1, true) })
	t.Run("sqlite/sync", func(t *testing.T) { callbackStorm(t, nil, 1, false) })
	t.Run("postgres/three_instances/async", func(t *testing.T) {
		callbackStorm(t, []string{"--db", dbtest.FreshPostgres(t, "onceguard_e2e_callbacks")}, 3, true)
	})
	t.Run("mysql/async", func(t *testing.T) {
		callbackStorm(t, []string{"--db", "mysql://" + dbtest.FreshMySQL(t, "onceguard_e2e_callbacks")}, 1, true)
	})
}

func callbackStorm(t *testing.T, dbArgs []string, instances int, async bool) {
	const copies, users, withdrawals = 20, 3, 4
	rl := newRelay(t, copies)
	relaySrv := &http.Server{Handler: rl}
	relayURL := serveLoopback(t, relaySrv)
	pspArgs := []string{"--notify", relayURL}
	if async {
		pspArgs = append(pspArgs, "--async", "--settle-after", "20ms")
	}
	pspURL, stopPSP := startPSPStop(t, pspArgs...)
	serveArgs := append([]string{"--psp", pspURL, "--psp-notify-secret", callbackSecret, "--reconcile-interval", "50ms",
		"--require-submit-token", "none", "--repeat-window", "0", "--rate-limit", "0"}, dbArgs...)
	bases := make([]string, instances)
	for i := range bases {
		bases[i] = startServe(t, serveArgs...)
	}
	rl.mu.Lock()
	rl.targets = bases
	rl.mu.Unlock()

	pspFault(t, pspURL, "notify_delay") // the first deposit's callback comes 2s late
	type movement struct {
		c                *client
		table, id, want  string
		amount           money.Amount
		replayKey, first string
	}
	var all []movement
	clients := make([]*client, users)
	for u := range users {
		c := signUp(t, bases[u%len(bases)], fmt.Sprintf("cb_user_%d", u))
		clients[u] = c
		a := c.do("POST", "/api/v1/deposits", fmt.Sprintf("dep-%d", u), `{"amount":"100.00"}`)
		c.expect(a, 201, "")
		if st := a.body["status"]; async && st != "pending" || !async && st != "succeeded" {
			t.Errorf("deposit = %v; want pending with --async, else succeeded", a.raw)
		}
		id := a.body["id"].(string)
		all = append(all, movement{c: c, table: "deposits", id: id, want: "succeeded", amount: 100_00, replayKey: fmt.Sprintf("dep-%d", u), first: a.raw})
		if st := waitSettled(t, c, "deposits", id); st != "succeeded" {
			t.Fatalf("deposit %s = %s; want succeeded", id, st)
		}
	}
	// Withdrawals from every user at once, one declined by the provider;
	// one callback delivered 5 times at once, one first signed wrongly.
	pspFault(t, pspURL, "decline", "notify_duplicate", "notify_bad_signature")
	var wg sync.WaitGroup
	var mu sync.Mutex
	for u, c := range clients {
		for w := range withdrawals {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("wd-%d-%d", u, w)
				a := c.doRetry503("POST", "/api/v1/withdrawals", key, `{"amount":"10.00"}`)
				if a.status != 201 {
					t.Errorf("withdrawal %s = %d %s", key, a.status, a.raw)
					return
				}
				mu.Lock()
				all = append(all, movement{c: c, table: "withdrawals", id: a.body["id"].(string), amount: 10_00, replayKey: key, first: a.raw})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	declined := 0
	for i := range all {
		m := &all[i]
		got := waitSettled(t, m.c, m.table, m.id)
		if m.want == "" {
			m.want = pspStatus(t, pspURL, m.id) // the provider's word: one of them declined
		}
		if got != m.want || got != pspStatus(t, pspURL, m.id) {
			t.Errorf("%s %s = %s; want %s, as the provider says (%s)", m.table, m.id, got, m.want, pspStatus(t, pspURL, m.id))
		}
		if m.table == "withdrawals" && got == "failed" {
			declined++
		}
		// A replay of its key is its first 201 (pending with --async), whatever happened since.
		if a := m.c.do("POST", "/api/v1/"+m.table, m.replayKey, `{"amount":"`+m.amount.String()+`"}`); a.status != 201 || a.raw != m.first || a.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay of %s = %d %s; want the first answer %s replayed", m.replayKey, a.status, a.raw, m.first)
		}
	}
	if declined != 1 {
		t.Errorf("%d withdrawals failed; want the 1 declined", declined)
	}

	rl.waitDelivered(t, len(all), 1) // the delayed one too, and the 5 of the duplicated one

	// A stale "failed" for a succeeded deposit, signed, 20 times at once.
	var dep movement
	for _, m := range all {
		if m.table == "deposits" {
			dep = m
			break
		}
	}
	genuine := rl.eventFor(dep.id)
	if genuine == nil {
		t.Fatalf("no callback relayed for %s", dep.id)
	}
	var ev map[string]any
	if err := json.Unmarshal(genuine, &ev); err != nil {
		t.Fatal(err)
	}
	ev["id"], ev["type"] = "evt_stale_failure", "operation.failed"
	ev["operation"].(map[string]any)["status"] = "failed"
	stale, _ := json.Marshal(ev)
	for _, st := range rl.fanOut(bases, stale, sign(stale, time.Now())) {
		if st != http.StatusConflict {
			t.Errorf("a stale failure = %d; want 409", st)
		}
	}

	// Balances and ledgers exact: 100.00 in, 10.00 out per succeeded withdrawal.
	for _, c := range clients {
		var out money.Amount
		for _, m := range all {
			if m.c == c && m.table == "withdrawals" && m.want == "succeeded" {
				out += m.amount
			}
		}
		want := (100_00 - out).String()
		if got := c.balance(); got != want {
			t.Errorf("%s: balance %s; want %s", c.token[:8], got, want)
		}
		entries := c.items("/api/v1/ledger")
		var sum money.Amount
		kinds := map[string]int{}
		refs := map[string]bool{}
		for _, e := range entries {
			a, err := faultSignedAmount(e["amount"].(string))
			if err != nil {
				t.Fatal(err)
			}
			sum += a
			kinds[e["kind"].(string)]++
			key := e["kind"].(string) + " " + e["ref"].(string)
			if refs[key] {
				t.Errorf("ledger has %s twice", key)
			}
			refs[key] = true
		}
		if sum.String() != want {
			t.Errorf("ledger sums to %s; want the balance %s", sum, want)
		}
		if kinds["deposit"] != 1 || kinds["withdrawal"] != withdrawals {
			t.Errorf("ledger kinds %v; want 1 deposit and %d withdrawals", kinds, withdrawals)
		}
	}

	// No delivery may still be on its way when the counts are compared: a
	// provider whose delivery timed out redelivers. Stop the provider, then
	// the relay, which waits for the fan-outs in flight.
	stopPSP()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := relaySrv.Shutdown(sctx); err != nil {
		t.Fatalf("relay shutdown: %v", err)
	}

	// Every copy was answered 204, 409 (a contradiction), 401 (the bad
	// signature) or 503 (busy: the provider redelivers); never a 500. The
	// conflicts are exactly the stale failure's copies, and the instances
	// counted them; the 401s those of the wrongly signed delivery.
	counts := rl.counts()
	for st, n := range counts {
		if st != 204 && st != 409 && st != 401 && st != 503 {
			t.Errorf("%d callback copies answered %d; want 204, 409, 401 or 503", n, st)
		}
	}
	if counts[401] != copies {
		t.Errorf("%d copies answered 401; want the %d of the wrongly signed delivery", counts[401], copies)
	}
	if got := sumMetric(t, bases, "onceguard_psp_notifications_total", map[string]string{"outcome": "invalid_signature"}); got != copies {
		t.Errorf("invalid signatures counted %v; want %d", got, copies)
	}
	if counts[409] != copies {
		t.Errorf("%d copies answered 409; want the %d of the stale failure", counts[409], copies)
	}
	if got := sumMetric(t, bases, "onceguard_psp_notifications_total", map[string]string{"outcome": "conflict"}); got != copies {
		t.Errorf("conflicts counted %v; want %d", got, copies)
	}
	settled := sumMetric(t, bases, "onceguard_psp_notifications_total", map[string]string{"outcome": "settled"})
	agreed := sumMetric(t, bases, "onceguard_psp_notifications_total", map[string]string{"outcome": "agreed"})
	if settled+agreed != float64(counts[204]) || settled > float64(len(all)) {
		t.Errorf("settled %v + agreed %v; want the %d copies answered 204, at most %d settled", settled, agreed, counts[204], len(all))
	}
	t.Logf("%d movements, %d instances, async %v: copies answered %v; by callback %v settled, %v agreed", len(all), instances, async, counts, settled, agreed)
}

// serveLoopback serves srv on a free loopback port until the test ends and returns its URL.
func serveLoopback(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// A dropped callback (notify_drop): the async provider settles, nobody
// calls back, and the reconciler settles the movement by asking.
func TestCallbackDroppedReconciled(t *testing.T) {
	rl := newRelay(t, 1)
	relayURL := serveLoopback(t, &http.Server{Handler: rl})
	pspURL := startPSP(t, "--notify", relayURL, "--async", "--settle-after", "20ms")
	base := startServe(t, "--psp", pspURL, "--psp-notify-secret", callbackSecret, "--reconcile-interval", "100ms")
	rl.mu.Lock()
	rl.targets = []string{base}
	rl.mu.Unlock()
	pspFault(t, pspURL, "notify_drop")
	c := signUp(t, base, "dropped")
	a := c.do("POST", "/api/v1/deposits", "dep-dropped", `{"amount":"7.00"}`)
	c.expect(a, 201, "")
	if a.body["status"] != "pending" {
		t.Fatalf("deposit = %s; want pending", a.raw)
	}
	id := a.body["id"].(string)
	if st := waitSettled(t, c, "deposits", id); st != "succeeded" {
		t.Fatalf("deposit = %s; want succeeded", st)
	}
	if got := c.balance(); got != "7.00" {
		t.Errorf("balance %s; want 7.00", got)
	}
	// The pass counts what it settled after it settled it: wait for the count.
	var text string
	for deadline := time.Now().Add(10 * time.Second); ; {
		text = scrape(t, base)
		v, _ := metricValue(text, "onceguard_reconciler_settled_total", map[string]string{"result": "succeeded"})
		if v == 1 {
			break
		}
		if v > 1 || time.Now().After(deadline) {
			t.Fatalf("reconciler settled %v; want 1", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, _ := metricValue(text, "onceguard_psp_notifications_total", map[string]string{"outcome": "settled"}); v != 0 {
		t.Errorf("callbacks settled %v; want 0 (dropped)", v)
	}
	if n := len(rl.counts()); n != 0 {
		t.Errorf("the relay got callbacks %v; want none", rl.counts())
	}
}

// Forged, replayed-after-5-minutes and bit-flipped callbacks for a
// pending deposit are refused 401 and change nothing; the genuine one,
// captured, then settles it.
func TestCallbackForgeries(t *testing.T) {
	rl := newRelay(t, 1)
	relayURL := serveLoopback(t, &http.Server{Handler: rl})
	// Settles in an hour: only the callbacks below can settle it.
	pspURL := startPSP(t, "--notify", relayURL, "--async", "--settle-after", "1h")
	base := startServe(t, "--psp", pspURL, "--psp-notify-secret", callbackSecret, "--reconcile-interval", "1h")
	c := signUp(t, base, "forged")
	a := c.do("POST", "/api/v1/deposits", "dep-forged", `{"amount":"7.00"}`)
	c.expect(a, 201, "")
	id := a.body["id"].(string)
	genuine := []byte(fmt.Sprintf(`{"id":"evt_genuine","type":"operation.succeeded","created_at":%q,"operation":{"id":"op_1","key":%q,"kind":"charge","amount":"7.00","status":"succeeded","created_at":%q}}`,
		time.Now().UTC().Format(time.RFC3339), id, time.Now().UTC().Format(time.RFC3339)))
	flipped := bytes.Clone(genuine)
	flipped[bytes.Index(flipped, []byte(`"7.00"`))+1] ^= 0x04 // "3.00"
	post := func(body []byte, sig string) answer {
		req, _ := http.NewRequest("POST", base+"/api/v1/psp/notifications", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if sig != "" {
			req.Header.Set(webhook.OnceguardHeader, sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out := answer{status: resp.StatusCode, raw: string(raw)}
		_ = json.Unmarshal(raw, &out.body)
		return out
	}
	now := time.Now()
	for _, tc := range []struct {
		name string
		body []byte
		sig  string
		code string
	}{
		{"unsigned", genuine, "", "invalid_signature"},
		{"forged", genuine, webhook.Onceguard{}.Sign([]byte("whsec_guess"), now, genuine), "invalid_signature"},
		{"replayed after 5 minutes", genuine, sign(genuine, now.Add(-5*time.Minute-time.Second)), "signature_expired"},
		{"bit-flipped", flipped, sign(genuine, now), "invalid_signature"},
		{"signature of another time", genuine, strings.Replace(sign(genuine, now), "t=", "t=1", 1), "invalid_signature"},
	} {
		if got := post(tc.body, tc.sig); got.status != 401 || got.body["code"] != tc.code {
			t.Errorf("%s: %d %s; want 401 %s", tc.name, got.status, got.raw, tc.code)
		}
	}
	if st := c.do("GET", "/api/v1/deposits/"+id, "", "").body["status"]; st != "pending" {
		t.Errorf("deposit after the forgeries = %v; want pending", st)
	}
	if got := c.balance(); got != "0.00" {
		t.Errorf("balance after the forgeries = %s; want 0.00", got)
	}
	if n := len(c.items("/api/v1/ledger")); n != 0 {
		t.Errorf("%d ledger entries after the forgeries; want 0", n)
	}
	text := scrape(t, base)
	for outcome, want := range map[string]float64{"invalid_signature": 4, "signature_expired": 1, "settled": 0} {
		if v, _ := metricValue(text, "onceguard_psp_notifications_total", map[string]string{"outcome": outcome}); v != want {
			t.Errorf("onceguard_psp_notifications_total{outcome=%q} = %v; want %v", outcome, v, want)
		}
	}
	// The genuine callback, signed now, settles it; its replay within the window changes nothing.
	sig := sign(genuine, time.Now())
	for range 2 {
		if got := post(genuine, sig); got.status != 204 {
			t.Errorf("genuine callback = %d %s; want 204", got.status, got.raw)
		}
	}
	if got := c.balance(); got != "7.00" {
		t.Errorf("balance after the genuine callback = %s; want 7.00", got)
	}
}

// doRetry503 is do, retried with the same key while the answer is a 503
// (the store or a lock busy, as SQLite's single writer is on a loaded
// machine: nothing was done), as a client does, for up to a minute.
func (c *client) doRetry503(method, path, key, body string) answer {
	c.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		a := c.do(method, path, key, body)
		if a.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return a
		}
		time.Sleep(100 * time.Millisecond)
	}
}
