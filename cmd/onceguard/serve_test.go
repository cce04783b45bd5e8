package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
)

// startServe runs `onceguard serve` in process on a free port with a fresh
// data directory and returns its base URL; the test's end stops it.
func startServe(t *testing.T, extra ...string) string {
	t.Helper()
	base, stop := startServeLogs(t, io.Discard, extra...)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("serve after cancel = %v; want nil", err)
		}
	})
	return base
}

// startServeLogs is startServe with the service's log lines going to logs;
// stop ends it and returns what serve returned.
func startServeLogs(t *testing.T, logs io.Writer, extra ...string) (base string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, extra...)
	go func() { done <- run(ctx, args, func(string) string { return "" }, out, logs) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { _ = stop() }) // should the wait below fail; stop runs once
	return listenURL(t, "serve", out, done, 20*time.Second), stop
}

type client struct {
	t     *testing.T
	base  string
	token string
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (c *client) do(method, path, key, body string) answer {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

func (c *client) expect(a answer, status int, code string) {
	c.t.Helper()
	got, _ := a.body["code"].(string)
	if a.status != status || got != code {
		c.t.Errorf("got %d %q (%s); want %d %q", a.status, got, a.raw, status, code)
	}
}

func signUp(t *testing.T, base, name string) *client {
	c := &client{t: t, base: base}
	c.expect(c.do("POST", "/api/v1/users", "", fmt.Sprintf(`{"username":%q,"password":"correct horse"}`, name)), 201, "")
	a := c.do("POST", "/api/v1/sessions", "", fmt.Sprintf(`{"username":%q,"password":"correct horse"}`, name))
	c.expect(a, 201, "")
	c.token, _ = a.body["token"].(string)
	return c
}

func (c *client) submitToken(purpose string) string {
	a := c.do("POST", "/api/v1/submit-tokens", "", fmt.Sprintf(`{"purpose":%q}`, purpose))
	c.expect(a, 201, "")
	tok, _ := a.body["token"].(string)
	return tok
}

// databases are the --db values the end-to-end tests run on: the embedded
// default always, PostgreSQL and MySQL when their servers are named (each
// in a database of its own).
func databases(t *testing.T) map[string]func(t *testing.T) []string {
	// One database per top-level test: TestServe -> onceguard_e2e_serve.
	name := "onceguard_e2e_" + strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	return map[string]func(t *testing.T) []string{
		"sqlite":   func(*testing.T) []string { return nil },
		"postgres": func(t *testing.T) []string { return []string{"--db", dbtest.FreshPostgres(t, name)} },
		"mysql":    func(t *testing.T) []string { return []string{"--db", "mysql://" + dbtest.FreshMySQL(t, name)} },
	}
}

// The embedded default end to end: sign up, deposit, withdraw with a
// submit token, replay, refusals in the contract's words, and a storm of
// one token that debits once.
func TestServe(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) { testServe(t, startServe(t, db(t)...)) })
	}
}

func testServe(t *testing.T, base string) {
	anon := &client{t: t, base: base}
	anon.expect(anon.do("GET", "/healthz", "", ""), 200, "")
	anon.expect(anon.do("GET", "/api/v1/account", "", ""), 401, "unauthenticated")
	anon.expect(anon.do("GET", "/nope", "", ""), 404, "not_found")
	anon.expect(anon.do("PUT", "/api/v1/users", "", ""), 405, "method_not_allowed")
	anon.expect(anon.do("POST", "/api/v1/users", "", `{"username":"A!","password":"correct horse"}`), 400, "invalid_username")
	anon.expect(anon.do("POST", "/api/v1/users", "", `{"username":"bob","password":"short"}`), 400, "invalid_password")
	anon.expect(anon.do("POST", "/api/v1/users", "", `{"username":"bob","username":"bob2","password":"correct horse"}`), 400, "invalid_json")
	anon.expect(anon.do("POST", "/api/v1/sessions", "", `{"username":"nobody","password":"correct horse"}`), 401, "invalid_credentials")

	alice := signUp(t, base, "alice")
	anon.expect(anon.do("POST", "/api/v1/users", "", `{"username":"alice","password":"correct horse"}`), 409, "username_taken")
	// Sign-in takes the name as it is, on every database (MySQL's
	// collations would match these to alice, each with a failure budget
	// of its own).
	for _, name := range []string{"ALICE", "Alice", "alice ", "alicé"} {
		anon.expect(anon.do("POST", "/api/v1/sessions", "", `{"username":"`+name+`","password":"correct horse"}`), 401, "invalid_credentials")
	}
	alice.expect(alice.do("POST", "/api/v1/submit-tokens", "", `{"purpose":"lunch"}`), 400, "invalid_purpose")

	// Deposit 100.00 (plain keys are fine for deposits by default).
	dep := alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100"}`)
	alice.expect(dep, 201, "")
	if dep.body["status"] != "succeeded" || dep.body["amount"] != "100.00" {
		t.Errorf("deposit = %s; want succeeded 100.00", dep.raw)
	}
	again := alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":100.00}`)
	if again.raw != dep.raw || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("deposit replay = %s (%v); want the first answer replayed", again.raw, again.header.Get("Idempotent-Replayed"))
	}
	alice.expect(alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"99"}`), 422, "idempotency_key_reused")
	alice.expect(alice.do("POST", "/api/v1/deposits", "dep-2", `{"amount":"1.234"}`), 400, "invalid_amount")
	alice.expect(alice.do("POST", "/api/v1/deposits", "", `{"amount":"1"}`), 400, "idempotency_key_missing")

	// Withdrawals need a submit token by default.
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "plain", `{"amount":"10"}`), 400, "submit_token_required")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "st_forged", `{"amount":"10"}`), 400, "submit_token_invalid")
	tok := alice.submitToken("withdrawal")
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 20 { // a storm of one token
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":"30.00"}`)
			mu.Lock()
			codes[a.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[201] < 1 || codes[201]+codes[409] != 20 {
		t.Errorf("20 withdrawals with one token: answers %v; want only 201s (one fresh, the rest replays) and 409s", codes)
	}
	// Inside the repeat window, the same body under a new token: 429.
	alice.expect(alice.do("POST", "/api/v1/withdrawals", alice.submitToken("withdrawal"), `{"amount":"30"}`), 429, "duplicate_submission")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", alice.submitToken("withdrawal"), `{"amount":"1000"}`), 422, "insufficient_funds")

	acct := alice.do("GET", "/api/v1/account", "", "")
	if acct.body["balance"] != "70.00" || acct.body["currency"] != "CNY" {
		t.Errorf("account = %s; want balance 70.00 CNY (one debit of 30.00)", acct.raw)
	}
	led := alice.do("GET", "/api/v1/ledger", "", "")
	items, _ := led.body["items"].([]any)
	if len(items) != 2 {
		t.Errorf("ledger = %s; want 2 entries (deposit, withdrawal)", led.raw)
	}

	deps := alice.do("GET", "/api/v1/deposits", "", "")
	if items, _ := deps.body["items"].([]any); len(items) != 1 {
		t.Errorf("deposits = %s; want 1", deps.raw)
	}
	wds := alice.do("GET", "/api/v1/withdrawals", "", "")
	items, _ = wds.body["items"].([]any)
	if len(items) != 1 {
		t.Fatalf("withdrawals = %s; want 1", wds.raw)
	}
	wid, _ := items[0].(map[string]any)["id"].(string)
	if one := alice.do("GET", "/api/v1/withdrawals/"+wid, "", ""); one.body["amount"] != "30.00" || one.body["status"] != "succeeded" {
		t.Errorf("withdrawal = %s; want 30.00 succeeded", one.raw)
	}

	// Another user cannot use alice's token or see her money. The token is
	// fresh (never used), so only its binding to alice refuses bob; and
	// his refusal does not burn it: alice uses it afterwards.
	bob := signUp(t, base, "bob")
	bob.expect(bob.do("GET", "/api/v1/withdrawals/"+wid, "", ""), 404, "not_found")
	fresh := alice.submitToken("withdrawal")
	bob.expect(bob.do("POST", "/api/v1/withdrawals", fresh, `{"amount":"5.00"}`), 400, "submit_token_invalid")
	if a := bob.do("GET", "/api/v1/account", "", ""); a.body["balance"] != "0.00" {
		t.Errorf("bob's account = %s; want 0.00", a.raw)
	}
	alice.expect(alice.do("POST", "/api/v1/withdrawals", fresh, `{"amount":"5.00"}`), 201, "")
	if a := alice.do("GET", "/api/v1/account", "", ""); a.body["balance"] != "65.00" {
		t.Errorf("alice's account after using the token bob was refused = %s; want 65.00", a.raw)
	}
	// The token alice already consumed is refused to bob too.
	bob.expect(bob.do("POST", "/api/v1/withdrawals", tok, `{"amount":"30.00"}`), 400, "submit_token_invalid")
	// Logout ends the session at once.
	bob.expect(bob.do("DELETE", "/api/v1/sessions/current", "", ""), 204, "")
	bob.expect(bob.do("GET", "/api/v1/account", "", ""), 401, "unauthenticated")
}

// Orders are paid once, whatever the keys: 15 concurrent payments of one
// order with different keys debit once; the others see 409 (in progress
// or already paid); the same key replays; another user's order is 404.
func TestServeOrders(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) { testServeOrders(t, startServe(t, db(t)...)) })
	}
}

func testServeOrders(t *testing.T, base string) {
	alice := signUp(t, base, "alice")
	alice.expect(alice.do("POST", "/api/v1/deposits", "d", `{"amount":"50"}`), 201, "")
	ord := alice.do("POST", "/api/v1/orders", alice.submitToken("order"), `{"amount":"20.00","description":"tea"}`)
	alice.expect(ord, 201, "")
	id, _ := ord.body["id"].(string)
	if ord.body["status"] != "created" || ord.body["order_no"] == "" || ord.body["amount"] != "20.00" {
		t.Fatalf("order = %s", ord.raw)
	}
	alice.expect(alice.do("POST", "/api/v1/orders", "o2", `{"amount":"1","description":"`+strings.Repeat("x", 201)+`"}`), 400, "invalid_request")
	alice.expect(alice.do("POST", "/api/v1/orders/"+id+"/payment", "p0", `{"method":"card"}`), 400, "invalid_request")
	// An id is exactly ours: another spelling names nothing, on every
	// database (MySQL's collations ignore case).
	upper := strings.ToUpper(id)
	alice.expect(alice.do("GET", "/api/v1/orders/"+upper, "", ""), 404, "not_found")
	alice.expect(alice.do("POST", "/api/v1/orders/"+upper+"/payment", "p-upper", `{"method":"wallet"}`), 404, "not_found")

	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	var inProgress []string
	for i := range 15 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("pay-%d", i)
			a := alice.do("POST", "/api/v1/orders/"+id+"/payment", key, `{"method":"wallet"}`)
			code, _ := a.body["code"].(string)
			mu.Lock()
			codes[fmt.Sprint(a.status, code)]++
			if code == "payment_in_progress" {
				inProgress = append(inProgress, key)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	// "In progress" is transient, not a stored answer: the same key runs
	// again and now learns the order is paid.
	for _, key := range inProgress {
		alice.expect(alice.do("POST", "/api/v1/orders/"+id+"/payment", key, `{"method":"wallet"}`), 409, "order_already_paid")
	}
	if codes["201"] != 1 || codes["201"]+codes["409order_already_paid"]+codes["409payment_in_progress"] != 15 {
		t.Errorf("15 payments of one order: %v; want one 201, the rest 409", codes)
	}
	if a := alice.do("GET", "/api/v1/account", "", ""); a.body["balance"] != "30.00" {
		t.Errorf("account = %s; want 30.00 (paid once)", a.raw)
	}
	order := alice.do("GET", "/api/v1/orders/"+id, "", "")
	if order.body["status"] != "paid" {
		t.Errorf("order = %s; want paid", order.raw)
	}
	// The paid order names its payment, which is the ledger entry's ref.
	ledger := alice.do("GET", "/api/v1/ledger", "", "")
	var paymentRef any
	for _, e := range ledger.body["items"].([]any) {
		if e := e.(map[string]any); e["kind"] == "payment" {
			paymentRef = e["ref"]
		}
	}
	if pid, _ := order.body["payment_id"].(string); pid == "" || pid != paymentRef {
		t.Errorf("order's payment_id = %v; want the ledger payment entry's ref %v", order.body["payment_id"], paymentRef)
	}
	list := alice.do("GET", "/api/v1/orders", "", "")
	if items, _ := list.body["items"].([]any); len(items) != 1 {
		t.Errorf("orders = %s; want 1", list.raw)
	}
	bob := signUp(t, base, "bob")
	bob.expect(bob.do("GET", "/api/v1/orders/"+id, "", ""), 404, "not_found")
	bob.expect(bob.do("POST", "/api/v1/orders/"+id+"/payment", "b1", `{"method":"wallet"}`), 404, "not_found")
	bob.expect(bob.do("GET", "/api/v1/orders/x/y", "", ""), 404, "not_found")
}

// listenURL waits until out, a command's standard output, says where it
// listens (its first "http://ADDR", up to a space or ';') and returns
// that URL; the test fails if done (buffered), where the command's run
// returns, delivers first (the error is put back for a stop that waits on
// done) or timeout passes.
func listenURL(t *testing.T, name string, out *syncBuffer, done chan error, timeout time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; {
		if i := strings.Index(out.String(), "http://"); i >= 0 {
			return strings.TrimSuffix(strings.Fields(out.String()[i:])[0], ";")
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("%s ended: %v; output %q", name, err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not say where it listens: %q", name, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
