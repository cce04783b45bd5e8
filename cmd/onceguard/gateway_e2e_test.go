//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
)

// The seeds' designs as upstreams (testdata/gateway): the PHP withdrawal
// endpoint under PHP's built-in server with 4 workers, and the Python
// order-payment service on http.server's ThreadingHTTPServer, both
// without their own locks and key checks. Straight at them a storm moves
// money several times; through two `onceguard gateway` processes on one
// PostgreSQL and one Redis it moves once per intent, a gateway killed
// mid-storm included.

// proc is a child process in a process group of its own.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

func startProc(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(name, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEGUARD_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s %v (pid %d) output:\n%s", name, args, p.cmd.Process.Pid, lastLines(p.out.String(), 40))
		}
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kill SIGKILLs the whole group (PHP's workers too) and waits for it.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitHTTP waits until base answers HTTP at all.
func waitHTTP(t *testing.T, p *proc, base string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(base + "/state")
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before answering:\n%s", base, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within 30 s: %v", base, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startGateway runs `onceguard gateway args...` and returns it and its URL.
func startGateway(t *testing.T, bin string, args ...string) (*proc, string) {
	t.Helper()
	p := startProc(t, nil, bin, append([]string{"gateway", "--addr", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	for deadline := time.Now().Add(30 * time.Second); ; {
		out := p.out.String()
		if i := strings.Index(out, "listening on http://"); i >= 0 {
			if f := strings.Fields(out[i+len("listening on "):]); len(f) > 0 && strings.HasSuffix(f[0], ";") {
				return p, strings.TrimSuffix(f[0], ";")
			}
		}
		select {
		case <-p.done:
			t.Fatalf("gateway exited before listening:\n%s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not listen within 30 s:\n%s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var e2eClient = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

type reply struct {
	status   int
	code     string
	body     string
	replayed bool
	err      error
}

func send(method, u string, body string, header ...string) reply {
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e2eClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true", err: err}
	if strings.Contains(resp.Header.Get("Content-Type"), "problem+json") {
		var p struct{ Code string }
		_ = json.Unmarshal(b, &p)
		r.code = p.Code
	}
	return r
}

// gwStorm sends n requests made by req(i), conc at a time, and returns the replies.
func gwStorm(n, conc int, req func(i int) reply) []reply {
	out := make([]reply, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				out[i] = req(i)
			}
		}()
	}
	wg.Wait()
	return out
}

// tally counts replies by "status code" ("201", "409 request_in_progress", "error").
func tally(rs []reply) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		switch {
		case r.err != nil:
			m["error"]++
		case r.code != "":
			m[fmt.Sprintf("%d %s", r.status, r.code)]++
		default:
			m[fmt.Sprint(r.status)]++
		}
	}
	return m
}

// phpUpstream starts the PHP withdrawal endpoint, or skips without php.
func phpUpstream(t *testing.T) (*proc, string) {
	t.Helper()
	php, err := exec.LookPath("php")
	if err != nil {
		t.Skip("php is not installed (CI installs php-cli and php-sqlite3); skipping the PHP upstream test")
	}
	script, _ := filepath.Abs("testdata/gateway/withdraw.php")
	bank := filepath.Join(t.TempDir(), "bank.db")
	if out, err := exec.Command(php, script, "setup", bank).CombinedOutput(); err != nil {
		t.Fatalf("php setup: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	p := startProc(t, []string{"BANK_DB=" + bank, "PHP_CLI_SERVER_WORKERS=4"}, php, "-S", addr, script)
	waitHTTP(t, p, "http://"+addr)
	return p, "http://" + addr
}

// phpLogin signs in at base (the upstream or a gateway in front) and returns the session cookie.
func phpLogin(t *testing.T, base, user string) string {
	t.Helper()
	resp, err := e2eClient.Post(base+"/login", "application/x-www-form-urlencoded", strings.NewReader("user="+user))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "PHPSESSID" {
			return c.Value
		}
	}
	t.Fatalf("login %s: no PHPSESSID (status %d)", user, resp.StatusCode)
	return ""
}

type phpState struct {
	Balance     int            `json:"balance"`
	Withdrawals int            `json:"withdrawals"`
	Withdrawn   int            `json:"withdrawn"`
	ByToken     map[string]int `json:"by_token"`
	Seen        map[string]int `json:"seen"`
}

func phpStateOf(t *testing.T, upstream, sid string) phpState {
	t.Helper()
	r := send("GET", upstream+"/state", "", "Cookie", "PHPSESSID="+sid)
	var s phpState
	if r.err != nil || r.status != 200 || json.Unmarshal([]byte(r.body), &s) != nil {
		t.Fatalf("state = %+v", r)
	}
	return s
}

// Straight at the PHP endpoint, 50 identical withdrawals (one intent, one
// withdraw_token) debit several times, and lose updates.
func TestPHPUpstreamAloneDebitsSeveralTimes(t *testing.T) {
	_, upstream := phpUpstream(t)
	sid := phpLogin(t, upstream, "alice")
	rs := gwStorm(50, 50, func(int) reply {
		return send("POST", upstream+"/withdraw", "amount=1000&withdraw_token=t-1", "Content-Type", "application/x-www-form-urlencoded", "Cookie", "PHPSESSID="+sid)
	})
	s := phpStateOf(t, upstream, sid)
	t.Logf("straight at the upstream: %v; withdrawals %d, withdrawn %d, balance %d (started 1000000)", tally(rs), s.Withdrawals, s.Withdrawn, s.Balance)
	if s.Withdrawals < 2 {
		t.Errorf("the unguarded endpoint recorded %d withdrawals of one intent; want several (the race the gateway is for)", s.Withdrawals)
	}
}

// Through two gateways on PostgreSQL and Redis, with withdraw_token as
// the key: 200 same-key requests, 50 fresh tokens with one body, and a
// gateway killed while forwarding each end in exactly one debit; the operator
// answers the key whose gateway died.
func TestGatewayPHPTwoInstances(t *testing.T) {
	_, upstream := phpUpstream(t)
	dbURL := dbtest.FreshPostgres(t, "onceguard_gw_php")
	redisURL := stormRedis(t)
	bin := buildFaultService(t)
	args := []string{"--upstream", upstream, "--db", dbURL, "--redis", redisURL, "--route", "POST /withdraw withdrawal",
		"--principal-cookie", "PHPSESSID", "--key-field", "withdraw_token", "--require-submit-token", "withdrawal",
		"--upstream-timeout", "4s", "--key-lease", "6s", "--repeat-window", "30s"}
	gwA, a := startGateway(t, bin, args...)
	_, b := startGateway(t, bin, args...)
	gws := []string{a, b}
	sid := phpLogin(t, a, "alice") // through the gateway: pass-through, Set-Cookie and all
	cookie := "PHPSESSID=" + sid
	const form = "application/x-www-form-urlencoded"
	token := func(gw string) string {
		t.Helper()
		r := send("POST", gw+"/onceguard/v1/submit-tokens", `{"purpose":"withdrawal"}`, "Content-Type", "application/json", "Cookie", cookie)
		var v struct{ Token string }
		if r.status != 201 || json.Unmarshal([]byte(r.body), &v) != nil {
			t.Fatalf("submit token = %+v", r)
		}
		return v.Token
	}
	withdraw := func(gw, body string, header ...string) reply {
		return send("POST", gw+"/withdraw", body, append([]string{"Content-Type", form, "Cookie", cookie}, header...)...)
	}

	t.Run("200 same-key requests", func(t *testing.T) {
		tok := token(a)
		rs := gwStorm(200, 32, func(i int) reply { return withdraw(gws[i%2], "amount=100&withdraw_token="+tok) })
		got := tally(rs)
		t.Logf("200 same-key: %v", got)
		s := phpStateOf(t, upstream, sid)
		if s.ByToken[tok] != 1 || s.Seen[tok] != 1 {
			t.Errorf("debits under the token = %d, requests that reached the upstream = %d; want 1 and 1", s.ByToken[tok], s.Seen[tok])
		}
		first := ""
		for _, r := range rs {
			switch {
			case r.status == 201 && (first == "" || r.body == first):
				first = r.body
			case r.status == 409 && r.code == "request_in_progress":
			default:
				t.Errorf("reply %+v; want 201 (the one answer, replayed) or 409 request_in_progress", r)
			}
		}
		if got["201"] < 1 {
			t.Errorf("no 201 among %v", got)
		}
		if r := withdraw(b, "amount=100&withdraw_token="+tok); r.status != 201 || !r.replayed || r.body != first {
			t.Errorf("after the storm = %+v; want the first answer replayed", r)
		}
	})

	t.Run("50 fresh tokens, one body, in the window", func(t *testing.T) {
		toks := make([]string, 50)
		for i := range toks {
			toks[i] = token(gws[i%2])
		}
		before := phpStateOf(t, upstream, sid)
		rs := gwStorm(50, 50, func(i int) reply { return withdraw(gws[i%2], "withdraw_token="+toks[i]+"&amount=200") })
		got := tally(rs)
		t.Logf("50 tokens, one body: %v", got)
		after := phpStateOf(t, upstream, sid)
		if d := after.Withdrawals - before.Withdrawals; d != 1 || got["201"] != 1 || got["429 duplicate_submission"] != 49 {
			t.Errorf("debits %d, replies %v; want 1 debit, one 201 and 49 429 duplicate_submission", d, got)
		}
	})

	t.Run("a gateway killed while forwarding", func(t *testing.T) {
		tok := token(a)
		body := "amount=300&withdraw_token=" + tok
		slow := []string{"X-Test-Delay-Ms", "1500"}
		// The first request goes to A, which forwards it; A dies while the
		// upstream works on it, and retries arrive at both.
		first := make(chan reply, 1)
		go func() { first <- withdraw(a, body, slow...) }()
		for deadline := time.Now().Add(20 * time.Second); phpStateOf(t, upstream, sid).Seen[tok] == 0; {
			if time.Now().After(deadline) {
				t.Fatal("the upstream never saw the first request")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// kill -9 while the upstream still works on it (1.5 s), before A
		// could record an answer: killed later, in the storm, a slow machine
		// let the answer come first, and B rightly replayed it.
		gwA.kill()
		var rs []reply
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs = gwStorm(100, 16, func(i int) reply { return withdraw(gws[i%2], body, slow...) })
		}()
		wg.Wait()
		if r := <-first; r.err == nil {
			t.Logf("the first request answered %d before the kill", r.status)
		}
		t.Logf("retries after the kill: %v", tally(rs))
		// After A's lease ran out, B answers for the key: it cannot know
		// whether A's forward happened, so it says so, and forwards nothing.
		var last reply
		for deadline := time.Now().Add(30 * time.Second); ; {
			last = withdraw(b, body, slow...)
			if last.status != 409 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("still in progress after 30 s: %+v", last)
			}
			time.Sleep(200 * time.Millisecond)
		}
		s := phpStateOf(t, upstream, sid)
		if s.ByToken[tok] != 1 || s.Seen[tok] != 1 {
			t.Fatalf("debits %d, requests that reached the upstream %d; want exactly 1 and 1", s.ByToken[tok], s.Seen[tok])
		}
		if last.status != 502 || last.code != "upstream_outcome_unknown" {
			t.Fatalf("B after A's lease = %+v; want 502 upstream_outcome_unknown", last)
		}
		if r := withdraw(b, body); r.code != "upstream_outcome_unknown" || !r.replayed {
			t.Errorf("again = %+v; want the unknown outcome replayed", r)
		}
		// The operator checks the upstream's records (one withdrawal under
		// the token) and answers the key with what it got.
		var out bytes.Buffer
		keyArgs := []string{"--db", dbURL, "--path", "/withdraw", "--key", tok, "--cookie", sid}
		if err := run(context.Background(), append([]string{"keys", "inspect"}, keyArgs...), func(string) string { return "" }, &out, io.Discard); err != nil ||
			!strings.Contains(out.String(), `"outcome_unknown": true`) {
			t.Fatalf("keys inspect = %v\n%s", err, out.String())
		}
		answer := `{"id":1,"amount":300,"settled_by":"operator"}`
		out.Reset()
		if err := run(context.Background(), append([]string{"keys", "answer", "--status", "201", "--body", answer}, keyArgs...), func(string) string { return "" }, &out, io.Discard); err != nil {
			t.Fatalf("keys answer = %v", err)
		}
		if r := withdraw(b, body); r.status != 201 || !r.replayed || r.body != answer {
			t.Errorf("after keys answer = %+v; want 201 %s replayed", r, answer)
		}
		if err := run(context.Background(), append([]string{"keys", "fail"}, keyArgs...), func(string) string { return "" }, io.Discard, io.Discard); err == nil {
			t.Error("keys fail of an answered key succeeded without --force; want refused")
		}
		if s := phpStateOf(t, upstream, sid); s.ByToken[tok] != 1 || s.Seen[tok] != 1 {
			t.Errorf("in the end: debits %d, requests %d; want 1 and 1", s.ByToken[tok], s.Seen[tok])
		}
	})
}

// pyUpstream starts the Python order service on addr (a free one if "")
// with its database at bank (set up if new).
func pyUpstream(t *testing.T, bank, addr string) (*proc, string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed; skipping the Python upstream test")
	}
	script, _ := filepath.Abs("testdata/gateway/order_service.py")
	if _, err := os.Stat(bank); err != nil {
		if out, err := exec.Command(py, script, "setup", bank).CombinedOutput(); err != nil {
			t.Fatalf("python setup: %v\n%s", err, out)
		}
	}
	if addr == "" {
		addr = freeAddr(t)
	}
	_, port, _ := net.SplitHostPort(addr)
	p := startProc(t, nil, py, script, "serve", bank, port)
	waitHTTP(t, p, "http://"+addr)
	return p, "http://" + addr
}

type pyState struct {
	Payments int            `json:"payments"`
	Seen     map[string]int `json:"seen"`
	Balance  int            `json:"balance"`
}

func pyStateOf(t *testing.T, upstream string, order int) pyState {
	t.Helper()
	r := send("GET", fmt.Sprintf("%s/state?order=%d", upstream, order), "", "X-User-Id", "u1")
	var s pyState
	if r.err != nil || r.status != 200 || json.Unmarshal([]byte(r.body), &s) != nil {
		t.Fatalf("state = %+v", r)
	}
	return s
}

func pyOrder(t *testing.T, base string) int {
	t.Helper()
	r := send("POST", base+"/orders", `{"amount":500}`, "Content-Type", "application/json", "X-User-Id", "u1")
	var v struct{ ID int }
	if r.status != 201 || json.Unmarshal([]byte(r.body), &v) != nil {
		t.Fatalf("new order = %+v", r)
	}
	return v.ID
}

// The Python order service: unguarded, a storm pays one order several
// times; through two gateways (principal from X-User-Id, the key in the
// Idempotency-Key header) 200 same-key requests and 50 keys with one body
// pay it once each; killed mid-request, its key answers
// upstream_outcome_unknown and is never forwarded again; down before
// sending, upstream_unavailable, and the retry runs once.
func TestGatewayPythonUpstream(t *testing.T) {
	bank := filepath.Join(t.TempDir(), "orders.db")
	py, upstream := pyUpstream(t, bank, "")
	pay := func(base string, order int, key string, header ...string) reply {
		return send("POST", fmt.Sprintf("%s/orders/%d/pay", base, order), `{"method":"wallet"}`,
			append([]string{"Content-Type", "application/json", "X-User-Id", "u1", "Idempotency-Key", key}, header...)...)
	}

	alone := pyOrder(t, upstream)
	gwStorm(50, 50, func(int) reply { return pay(upstream, alone, "k", "X-Test-Delay-Ms", "300") })
	if s := pyStateOf(t, upstream, alone); s.Payments < 2 {
		t.Errorf("straight at the service, one order was paid %d times; want several", s.Payments)
	} else {
		t.Logf("straight at the service: one order paid %d times", s.Payments)
	}

	dbURL := dbtest.FreshPostgres(t, "onceguard_gw_py")
	redisURL := stormRedis(t)
	bin := buildFaultService(t)
	args := []string{"--upstream", upstream, "--db", dbURL, "--redis", redisURL, "--route", "POST /orders/{id}/pay payment",
		"--principal-header", "X-User-Id", "--upstream-timeout", "4s", "--key-lease", "6s", "--repeat-window", "30s"}
	_, a := startGateway(t, bin, args...)
	_, b := startGateway(t, bin, args...)
	gws := []string{a, b}

	order := pyOrder(t, a) // POST /orders is not guarded: passed through
	rs := gwStorm(200, 32, func(i int) reply { return pay(gws[i%2], order, "same-key") })
	t.Logf("200 same-key: %v", tally(rs))
	if s := pyStateOf(t, upstream, order); s.Payments != 1 || s.Seen["same-key"] != 1 {
		t.Errorf("payments %d, requests that reached it %d; want 1 and 1", s.Payments, s.Seen["same-key"])
	}
	for _, r := range rs {
		if r.status != 201 && r.code != "request_in_progress" {
			t.Errorf("reply %+v; want 201 or 409 request_in_progress", r)
		}
	}

	order2 := pyOrder(t, a)
	rs = gwStorm(50, 50, func(i int) reply { return pay(gws[i%2], order2, fmt.Sprintf("key-%d", i)) })
	got := tally(rs)
	t.Logf("50 keys, one body: %v", got)
	if s := pyStateOf(t, upstream, order2); s.Payments != 1 || got["201"] != 1 || got["429 duplicate_submission"] != 49 {
		t.Errorf("payments %d, replies %v; want 1 payment, one 201, 49 duplicate_submission", s.Payments, got)
	}

	// Killed mid-request: the request was sent, the process died.
	order3, order4 := pyOrder(t, a), pyOrder(t, a)
	done := make(chan reply, 1)
	go func() { done <- pay(a, order3, "dies", "X-Test-Delay-Ms", "3000") }()
	for deadline := time.Now().Add(20 * time.Second); pyStateOf(t, upstream, order3).Seen["dies"] == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the service never saw the request")
		}
		time.Sleep(10 * time.Millisecond)
	}
	addr := strings.TrimPrefix(upstream, "http://")
	py.kill()
	r := <-done
	if r.status != 502 || r.code != "upstream_outcome_unknown" {
		t.Fatalf("upstream killed mid-request = %+v; want 502 upstream_outcome_unknown", r)
	}
	// Down before sending: unavailable, nothing stored. (Another order:
	// order3's body is in the repeat window under "dies".)
	if r := pay(b, order4, "later"); r.status != 502 || r.code != "upstream_unavailable" {
		t.Fatalf("upstream down = %+v; want 502 upstream_unavailable", r)
	}
	_, upstream = pyUpstream(t, bank, addr) // back, with its records
	for _, gw := range gws {
		if r := pay(gw, order3, "dies"); r.status != 502 || r.code != "upstream_outcome_unknown" || !r.replayed {
			t.Errorf("the killed key again = %+v; want the unknown outcome replayed", r)
		}
	}
	if r := pay(b, order4, "later"); r.status != 201 {
		t.Errorf("the unavailable key's retry = %+v; want 201", r)
	}
	if r := pay(a, order4, "later"); r.status != 201 || !r.replayed {
		t.Errorf("and again = %+v; want the replay", r)
	}
	s3, s4 := pyStateOf(t, upstream, order3), pyStateOf(t, upstream, order4)
	if s3.Seen["dies"] != 1 || s3.Payments != 0 || s4.Seen["later"] != 1 || s4.Payments != 1 {
		t.Errorf("killed key: %d requests, %d payments; unavailable key: %d requests, %d payments; want 1, 0 (never forwarded again) and 1, 1 (the retry once)",
			s3.Seen["dies"], s3.Payments, s4.Seen["later"], s4.Payments)
	}
}
