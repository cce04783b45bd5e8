//go:build unix

package main

// End-to-end fault tests: a payment provider that times out (before and
// after it moved the money) or declines, and a service process SIGKILLed
// in the middle of a storm of withdrawals and restarted on the same
// database. Each runs on every database of databases(t).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// --- the provider, seen from the test ---

// faultPSP serves a psp.Sim over HTTP (psp.Handler) and keeps, per
// idempotency key, the order in which the service's calls reached it, so
// that a test can tell the request's own provider call from the
// reconciler's (which always asks with a GET before it sends a POST).
//
// An injected timeout makes psp.Handler hang until the client gives up;
// the service's client waits 10 s for that. faultPSP cuts such a call
// after cut with a 503, which the service's client reads, like a
// transport timeout, as an unknown outcome (psp.ErrUnknownOutcome): the
// same path through the service, without 10 s per timeout.
type faultPSP struct {
	sim  *psp.Sim
	url  string
	next http.Handler

	// hold > 0: the hold-th payout request (for a withdrawal, "wd_...")
	// is performed, so the provider pays, but never answered; its key is
	// sent on held and the request hangs until the service goes away.
	hold int
	held chan string

	mu      sync.Mutex
	calls   map[string][]string // key -> methods, in arrival order
	payouts int
}

func startFaultPSP(t *testing.T, sim *psp.Sim, cut time.Duration) *faultPSP {
	t.Helper()
	f := &faultPSP{sim: sim, next: http.TimeoutHandler(psp.Handler(sim), cut, "provider timed out"), calls: map[string][]string{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close) // registered before the service starts: closed after it stops
	f.url = srv.URL
	return f
}

func (f *faultPSP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if k, ok := strings.CutPrefix(r.URL.Path, "/v1/operations/"); ok {
		key = k
	}
	f.mu.Lock()
	f.calls[key] = append(f.calls[key], r.Method)
	n := 0
	if r.Method == "POST" && strings.HasPrefix(key, "wd_") {
		f.payouts++
		n = f.payouts
	}
	f.mu.Unlock()
	if f.hold > 0 && n == f.hold {
		f.next.ServeHTTP(httptest.NewRecorder(), r) // the money moves...
		f.held <- key
		<-r.Context().Done() // ...and the answer never reaches the service
		return
	}
	f.next.ServeHTTP(w, r)
}

// log is the methods of the calls the provider saw for key, in order.
func (f *faultPSP) log(key string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls[key])
}

// expectUnknown checks the 201 of a movement whose provider call ended
// with an unknown outcome: the contract's "pending". One race is allowed:
// the reconciler (every 100 ms) may reach the provider between the
// movement's commit and the request's own call, and its POST may reach
// the provider's books before the request's (even when the request's
// arrived first on the wire); then it took the injected fault, the
// request's call found the operation done, and "succeeded" is right too.
// The reconciler always asks (GET) before it sends (POST) and the request
// never asks, so a GET in the provider's log for id says the reconciler
// was there.
func (f *faultPSP) expectUnknown(t *testing.T, a answer) string {
	t.Helper()
	id, _ := a.body["id"].(string)
	if a.status != 201 || id == "" {
		t.Fatalf("answer = %d %s; want 201 with an id", a.status, a.raw)
	}
	switch calls, status := f.log(id), a.body["status"]; {
	case status == "pending":
	case slices.Contains(calls, "GET") && status == "succeeded":
		t.Logf("%s: the reconciler reached the provider while the request did (calls %v); answer %s", id, calls, strings.TrimSpace(a.raw))
	default:
		t.Errorf("answer = %s (provider saw %v for it); want status \"pending\": the provider's outcome was unknown", strings.TrimSpace(a.raw), calls)
	}
	return id
}

func faultExpectMoved(t *testing.T, sim *psp.Sim, kind psp.Kind, count int, total string) {
	t.Helper()
	if n, sum := sim.Moved(kind); n != count || sum.String() != total {
		t.Errorf("provider moved %d %s operations, %s in total; want %d, %s", n, kind, sum, count, total)
	}
}

// faultExpectOp checks the provider's record for key (a movement id).
func faultExpectOp(t *testing.T, sim *psp.Sim, key string, kind psp.Kind, amount string, status psp.Status) {
	t.Helper()
	op, err := sim.Lookup(context.Background(), key)
	if err != nil || op.Kind != kind || op.Amount.String() != amount || op.Status != status {
		t.Errorf("provider's operation for %s = %+v, %v; want a %s of %s, %s", key, op, err, kind, amount, status)
	}
}

// --- the service's account, seen from the test ---

func faultBalance(c *client) string {
	c.t.Helper()
	a := c.do("GET", "/api/v1/account", "", "")
	if a.status != 200 {
		c.t.Fatalf("GET /api/v1/account = %d %s", a.status, a.raw)
	}
	b, _ := a.body["balance"].(string)
	return b
}

func faultExpectBalance(t *testing.T, c *client, want string) {
	t.Helper()
	if got := faultBalance(c); got != want {
		t.Errorf("balance = %s; want %s", got, want)
	}
}

// faultWaitMovement polls GET /api/v1/{table}/{id} until its status is want,
// for at most 15 s, and returns the last answer.
func faultWaitMovement(t *testing.T, c *client, table, id, want string) answer {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		a := c.do("GET", "/api/v1/"+table+"/"+id, "", "")
		if a.status == 200 && a.body["status"] == want {
			return a
		}
		if a.status != 200 || time.Now().After(deadline) {
			t.Fatalf("GET %s/%s = %d %s; want status %q within 15 s (the reconciler runs every 100 ms)", table, id, a.status, a.raw, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// faultSignedAmount parses an amount as the API writes it, with an optional
// minus sign (ledger debits).
func faultSignedAmount(s string) (money.Amount, error) {
	neg := strings.HasPrefix(s, "-")
	a, err := money.Parse(strings.TrimPrefix(s, "-"))
	if neg {
		a = -a
	}
	return a, err
}

type faultLedgerEntry struct {
	Kind, Amount, BalanceAfter, Ref string
}

// faultLedger reads the user's ledger and checks that it sums to balance.
func faultLedger(t *testing.T, c *client, balance string) []faultLedgerEntry {
	t.Helper()
	a := c.do("GET", "/api/v1/ledger", "", "")
	var l struct {
		Items []struct {
			Kind         string `json:"kind"`
			Amount       string `json:"amount"`
			BalanceAfter string `json:"balance_after"`
			Ref          string `json:"ref"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(a.raw), &l); a.status != 200 || err != nil {
		t.Fatalf("GET /api/v1/ledger = %d %s (%v)", a.status, a.raw, err)
	}
	var sum money.Amount
	out := make([]faultLedgerEntry, 0, len(l.Items))
	for _, e := range l.Items {
		v, err := faultSignedAmount(e.Amount)
		if err != nil {
			t.Errorf("ledger amount %q: %v", e.Amount, err)
		}
		sum += v
		out = append(out, faultLedgerEntry{e.Kind, e.Amount, e.BalanceAfter, e.Ref})
	}
	if sum.String() != balance {
		t.Errorf("ledger sums to %s; want the balance %s (ledger %s)", sum, balance, a.raw)
	}
	if len(l.Items) > 0 && l.Items[0].BalanceAfter != balance {
		t.Errorf("newest ledger entry has balance_after %s; want the balance %s", l.Items[0].BalanceAfter, balance)
	}
	return out
}

type faultMovement struct {
	ID     string `json:"id"`
	Amount string `json:"amount"`
	Status string `json:"status"`
}

func faultMovements(t *testing.T, c *client, table string) []faultMovement {
	t.Helper()
	a := c.do("GET", "/api/v1/"+table, "", "")
	var l struct {
		Items []faultMovement `json:"items"`
	}
	if err := json.Unmarshal([]byte(a.raw), &l); a.status != 200 || err != nil {
		t.Fatalf("GET /api/v1/%s = %d %s (%v)", table, a.status, a.raw, err)
	}
	return l.Items
}

// --- 1. the provider times out ---

// A provider that times out after it moved the money: the withdrawal's
// 201 says pending, the balance is debited once, the reconciler settles it
// to succeeded by asking under the withdrawal's id, the provider paid out
// once, and the same key replays without a second payout. The same for a
// deposit (credited once, when the charge is known to have succeeded), a
// timeout before the provider moved anything (resent under the same key:
// one payout) and a decline (failed, refunded).
func TestServeProviderTimeout(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testServeProviderTimeout(t, db)
		})
	}
}

func testServeProviderTimeout(t *testing.T, db func(*testing.T) []string) {
	sim := &psp.Sim{}
	front := startFaultPSP(t, sim, 500*time.Millisecond)
	base := startServe(t, append([]string{"--psp", front.url, "--reconcile-interval", "100ms"}, db(t)...)...)
	alice := signUp(t, base, "alice")

	// A deposit the provider answers at once.
	dep := alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100.00"}`)
	alice.expect(dep, 201, "")
	if dep.body["status"] != "succeeded" || dep.body["amount"] != "100.00" {
		t.Fatalf("deposit = %s; want 100.00 succeeded", dep.raw)
	}
	faultExpectBalance(t, alice, "100.00")
	faultExpectMoved(t, sim, psp.Charge, 1, "100.00")

	// A withdrawal whose payout times out after the provider paid.
	sim.Inject(psp.TimeoutAfterCommit)
	tok := alice.submitToken("withdrawal")
	wd := alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":"30.00"}`)
	wdID := front.expectUnknown(t, wd)
	if wd.body["amount"] != "30.00" {
		t.Errorf("withdrawal = %s; want amount 30.00", wd.raw)
	}
	faultExpectBalance(t, alice, "70.00")                           // debited once, with the withdrawal's row
	faultExpectOp(t, sim, wdID, psp.Payout, "30.00", psp.Succeeded) // the money did leave
	faultWaitMovement(t, alice, "withdrawals", wdID, "succeeded")
	faultExpectMoved(t, sim, psp.Payout, 1, "30.00")
	// The same key: the stored answer, byte for byte, and no second payout.
	again := alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":30}`)
	if again.status != 201 || again.raw != wd.raw || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("same key again = %d %s (Idempotent-Replayed %q); want the first answer %s replayed",
			again.status, again.raw, again.header.Get("Idempotent-Replayed"), wd.raw)
	}
	alice.expect(alice.do("POST", "/api/v1/withdrawals", tok, `{"amount":"31.00"}`), 422, "idempotency_key_reused")
	faultExpectMoved(t, sim, psp.Payout, 1, "30.00")
	faultExpectBalance(t, alice, "70.00")

	// A deposit whose charge times out after the provider charged.
	sim.Inject(psp.TimeoutAfterCommit)
	dep2 := alice.do("POST", "/api/v1/deposits", "dep-2", `{"amount":"25.50"}`)
	dep2ID := front.expectUnknown(t, dep2)
	// Not credited while pending: a balance read before a pending status
	// must not include it.
	bal := faultBalance(alice)
	if st := alice.do("GET", "/api/v1/deposits/"+dep2ID, "", ""); st.body["status"] == "pending" && bal != "70.00" {
		t.Errorf("balance %s while deposit %s is pending; want 70.00 (credited only when the charge is known)", bal, dep2ID)
	}
	faultExpectOp(t, sim, dep2ID, psp.Charge, "25.50", psp.Succeeded)
	faultWaitMovement(t, alice, "deposits", dep2ID, "succeeded")
	faultExpectBalance(t, alice, "95.50")
	faultExpectMoved(t, sim, psp.Charge, 2, "125.50")
	again = alice.do("POST", "/api/v1/deposits", "dep-2", `{"amount":"25.5"}`)
	if again.status != 201 || again.raw != dep2.raw || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("deposit key again = %d %s; want the first answer %s replayed", again.status, again.raw, dep2.raw)
	}
	faultExpectMoved(t, sim, psp.Charge, 2, "125.50")
	faultExpectBalance(t, alice, "95.50")

	// A payout that times out before the provider did anything: the
	// reconciler finds nothing under the id and sends it again, under the
	// same id.
	sim.Inject(psp.TimeoutBeforeCommit)
	wd2 := alice.do("POST", "/api/v1/withdrawals", alice.submitToken("withdrawal"), `{"amount":"12.34"}`)
	wd2ID := front.expectUnknown(t, wd2)
	faultExpectBalance(t, alice, "83.16")
	faultWaitMovement(t, alice, "withdrawals", wd2ID, "succeeded")
	faultExpectOp(t, sim, wd2ID, psp.Payout, "12.34", psp.Succeeded)
	faultExpectMoved(t, sim, psp.Payout, 2, "42.34")

	// A declined payout is definite: failed, refunded in full, nothing paid.
	sim.Inject(psp.Decline)
	wd3 := alice.do("POST", "/api/v1/withdrawals", alice.submitToken("withdrawal"), `{"amount":"5.00"}`)
	alice.expect(wd3, 201, "")
	wd3ID, _ := wd3.body["id"].(string)
	if wd3.body["status"] != "failed" {
		t.Errorf("declined withdrawal = %s; want status failed", wd3.raw)
	}
	faultExpectOp(t, sim, wd3ID, psp.Payout, "5.00", psp.Failed)
	faultExpectMoved(t, sim, psp.Payout, 2, "42.34")
	faultExpectBalance(t, alice, "83.16")

	// The books: 100 - 30 + 25.50 - 12.34 - 5 + 5 = 83.16.
	led := faultLedger(t, alice, "83.16")
	kinds := map[string]int{}
	refs := map[string]int{}
	for _, e := range led {
		kinds[e.Kind]++
		refs[e.Kind+" "+e.Ref]++
	}
	if len(led) != 6 || kinds["deposit"] != 2 || kinds["withdrawal"] != 3 || kinds["withdrawal_refund"] != 1 {
		t.Errorf("ledger = %+v; want 6 entries: 2 deposits, 3 withdrawals, 1 refund", led)
	}
	for _, r := range []string{"withdrawal " + wdID, "withdrawal " + wd2ID, "withdrawal " + wd3ID, "withdrawal_refund " + wd3ID, "deposit " + dep2ID} {
		if refs[r] != 1 {
			t.Errorf("ledger has %d entries %q; want 1 (ledger %+v)", refs[r], r, led)
		}
	}
	want := map[string]string{wdID: "30.00 succeeded", wd2ID: "12.34 succeeded", wd3ID: "5.00 failed"}
	wds := faultMovements(t, alice, "withdrawals")
	if len(wds) != 3 {
		t.Errorf("withdrawals = %+v; want 3", wds)
	}
	for _, w := range wds {
		if got := w.Amount + " " + w.Status; want[w.ID] != got {
			t.Errorf("withdrawal %s = %s; want %q", w.ID, got, want[w.ID])
		}
	}
	deps := faultMovements(t, alice, "deposits")
	if len(deps) != 2 || deps[0].Status != "succeeded" || deps[1].Status != "succeeded" {
		t.Errorf("deposits = %+v; want 2, succeeded", deps)
	}
}

// --- 2. the process is killed in a storm ---

// buildFaultService builds this command into a temporary directory with the
// test binary's own -race and -tags, so that the build reuses the
// packages go test has just compiled.
func buildFaultService(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "onceguard")
	args := []string{"build", "-o", bin}
	env := os.Environ()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "-race":
				if s.Value == "true" {
					args = append(args, "-race")
				}
			case "-tags":
				args = append(args, "-tags", s.Value)
			case "CGO_ENABLED":
				env = append(env, "CGO_ENABLED="+s.Value)
			}
		}
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Env = env
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %s in %v", bin, time.Since(start).Round(time.Millisecond))
	return bin
}

// faultProc is the service running as a child process, in a process group
// of its own.
type faultProc struct {
	cmd         *exec.Cmd
	base        string
	stdout, err *syncBuffer
	done        chan struct{} // closed when it has exited
	state       *os.ProcessState
}

func startFaultProcess(t *testing.T, bin string, args ...string) *faultProc {
	t.Helper()
	p := &faultProc{stdout: &syncBuffer{}, err: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"serve"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.err
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, kv := range os.Environ() { // the flags alone configure it
		if !strings.HasPrefix(kv, "ONCEGUARD_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the whole group
		<-p.done
		if t.Failed() {
			t.Logf("service (pid %d) stdout:\n%s\nstderr:\n%s", p.cmd.Process.Pid, p.stdout, p.err)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		out := p.stdout.String()
		if i := strings.Index(out, "listening on http://"); i >= 0 {
			if f := strings.Fields(out[i+len("listening on "):]); len(f) > 0 && strings.HasSuffix(f[0], ";") {
				p.base = strings.TrimSuffix(f[0], ";")
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("service exited (%v) before listening; stdout %q, stderr %q", p.state, out, p.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("service did not say where it listens within 30 s: stdout %q, stderr %q", out, p.err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill SIGKILLs the process group: no shutdown, no cleanup.
func (p *faultProc) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
	<-p.done
}

// terminate sends SIGTERM and expects exit status 0 within 15 s.
func (p *faultProc) terminate(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.done:
		if !p.state.Success() {
			t.Errorf("service after SIGTERM: %v; want exit status 0 (stderr %q)", p.state, p.err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("service did not exit within 15 s of SIGTERM")
	}
}

// faultSend is client.do without t: for goroutines, and for requests that may
// die with the process.
func faultSend(hc *http.Client, base, token, method, path, key, body string) (answer, error) {
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a, nil
}

// faultHit is one answer to a storm request.
type faultHit struct {
	phase    string // "storm" (before the kill) or "retry" (after the restart)
	status   int
	code, id string
	amount   string
	replayed bool
	raw      string
}

func (h faultHit) String() string {
	return fmt.Sprintf("%s:%d%s%s%s replayed=%v", h.phase, h.status, " "+h.code, " "+h.id, " "+h.amount, h.replayed)
}

func newFaultHit(phase string, a answer) faultHit {
	h := faultHit{phase: phase, status: a.status, replayed: a.header.Get("Idempotent-Replayed") == "true", raw: a.raw}
	h.code, _ = a.body["code"].(string)
	h.id, _ = a.body["id"].(string)
	h.amount, _ = a.body["amount"].(string)
	return h
}

// faultRetryAfter is the answer's Retry-After, at most 2 s, else 200 ms.
func faultRetryAfter(a answer) time.Duration {
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil && s > 0 {
		return min(time.Duration(s)*time.Second, 2*time.Second)
	}
	return 200 * time.Millisecond
}

// 40 concurrent withdrawals, each under its own key, and the process
// SIGKILLed in the middle: after 3 answers, while the provider has paid
// the 4th withdrawal but not yet answered, and 36 more keys wait for the
// user's lock. Restarted on the same database, every key is retried with
// the same body until it has a definite answer. Each key ends as exactly
// one withdrawal, listed once, paid out once, the books balance, and no
// answer is a 500.
//
// A key in flight at the kill is held by its record's lease (--key-lease,
// 3 s here): its retries answer 409 request_in_progress until then; the
// user's lock the killed process held blocks for its TTL (--lock-ttl, 2 s
// here): 503 busy until then. Each
// database's subtest does its storm and kill first, one after the other,
// then waits out the leases in parallel with the others.
func TestServeKilledMidStorm(t *testing.T) {
	bin := buildFaultService(t)
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) { testServeKilledMidStorm(t, bin, db(t)) })
	}
}

func testServeKilledMidStorm(t *testing.T, bin string, dbArgs []string) {
	const n = 40
	sim := &psp.Sim{}
	front := startFaultPSP(t, sim, 5*time.Second)
	front.hold, front.held = 4, make(chan string, 1)
	dataDir := t.TempDir() // the SQLite file; both runs use it
	args := func(reconcile string) []string {
		return append([]string{"--addr", "127.0.0.1:0", "--data-dir", dataDir, "--psp", front.url, "--reconcile-interval", reconcile,
			"--require-submit-token", "", "--repeat-window", "0", "--key-lease", "3s", "--lock-ttl", "2s"}, dbArgs...)
	}
	// The first run reconciles only after an hour: what it leaves pending
	// is for the restarted one to settle.
	first := startFaultProcess(t, bin, args("1h")...)

	alice := signUp(t, first.base, "alice")
	dep := alice.do("POST", "/api/v1/deposits", "storm-deposit", `{"amount":"1000.00"}`)
	if dep.status != 201 || dep.body["status"] != "succeeded" {
		t.Fatalf("deposit = %d %s; want 201 succeeded", dep.status, dep.raw)
	}

	// Key i withdraws i+1.25: 1.25 + 2.25 + ... + 40.25 = 830.00.
	keys := make([]string, n)
	bodies := make([]string, n)
	amounts := make([]string, n)
	var total money.Amount
	for i := range n {
		var b [16]byte
		_, _ = rand.Read(b[:])
		keys[i] = fmt.Sprintf("storm-%02d-%s", i, hex.EncodeToString(b[:]))
		amounts[i] = fmt.Sprintf("%d.25", i+1)
		bodies[i] = fmt.Sprintf(`{"amount":%q}`, amounts[i])
		a, _ := money.Parse(amounts[i])
		total += a
	}
	if total.String() != "830.00" {
		t.Fatalf("withdrawals total %s; want 830.00", total)
	}

	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	hits := make([][]faultHit, n)
	record := func(i int, h faultHit) {
		mu.Lock()
		hits[i] = append(hits[i], h)
		mu.Unlock()
	}

	// The storm, and the kill while the provider holds the 4th payout.
	var died []error
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := faultSend(hc, first.base, alice.token, "POST", "/api/v1/withdrawals", keys[i], bodies[i])
			if err != nil {
				mu.Lock()
				died = append(died, err)
				mu.Unlock()
				return
			}
			record(i, newFaultHit("storm", a))
		}()
	}
	var heldID string
	select {
	case heldID = <-front.held:
	case <-time.After(20 * time.Second):
		t.Fatalf("the provider saw no 4th payout within 20 s")
	}
	first.kill(t)
	wg.Wait()
	t.Logf("killed with payout %s paid but unanswered; %d answers, %d requests died with the process", heldID, n-len(died), len(died))
	if len(died) < n-3 {
		t.Errorf("%d requests died with the process; want at least %d (only 3 withdrawals were done)", len(died), n-3)
	}
	if op, err := sim.Lookup(context.Background(), heldID); err != nil || op.Kind != psp.Payout || op.Status != psp.Succeeded {
		t.Errorf("provider's operation for %s = %+v, %v; want a payout, succeeded", heldID, op, err)
	}

	// Restart on the same database; the session lives there too.
	second := startFaultProcess(t, bin, args("100ms")...)
	alice = &client{t: t, base: second.base, token: alice.token}
	// What the kill left: the withdrawal paid at the provider but not
	// answered, and whatever else was debited by then (the user's lock is
	// released after the debit, so several payouts may have been in
	// flight); the final checks below settle them all, once each.
	atKill := faultMovements(t, alice, "withdrawals")
	held := false
	for _, w := range atKill {
		held = held || w.ID == heldID
	}
	if !held || len(atKill) < 3 {
		t.Errorf("withdrawals after the kill = %+v; want the 3 answered ones and %s", atKill, heldID)
	}

	// The subtests of the other databases do their storm now; the retries
	// wait out the leases in parallel.
	t.Parallel()

	statuses := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				a, err := faultSend(hc, second.base, alice.token, "POST", "/api/v1/withdrawals", keys[i], bodies[i])
				wait := 200 * time.Millisecond
				if err == nil {
					h := newFaultHit("retry", a)
					record(i, h)
					mu.Lock()
					statuses[fmt.Sprint(a.status, " ", h.code)]++
					mu.Unlock()
					if a.status != 409 && a.status != 503 {
						return // definite (checked below)
					}
					wait = faultRetryAfter(a)
				}
				if time.Now().After(deadline) {
					record(i, faultHit{phase: "retry", code: fmt.Sprintf("no definite answer within 60 s (last error %v)", err)})
					return
				}
				time.Sleep(wait)
			}
		}()
	}
	wg.Wait()
	t.Logf("answers after the restart: %v", statuses)

	// Every key: exactly one withdrawal id, of its amount, never a 500.
	idOf := map[string]int{} // withdrawal id -> key index
	succeeded := 0
	for i := range n {
		hs := hits[i]
		last := hs[len(hs)-1]
		if last.status != 201 {
			t.Errorf("key %d (%s): final answer %v; want 201 (answers %v)", i, keys[i], last, hs)
			continue
		}
		succeeded++
		id := ""
		for _, h := range hs {
			switch {
			case h.status == 500:
				t.Errorf("key %d: a 500: %s", i, h.raw)
			case h.status == 201:
				if id == "" {
					id = h.id
				}
				if h.id != id || h.amount != amounts[i] {
					t.Errorf("key %d: answers %v; want every 201 to be withdrawal %s of %s", i, hs, id, amounts[i])
				}
			case h.status == 409 && h.code == "request_in_progress", h.status == 503:
			default:
				t.Errorf("key %d: answer %v (%s); want only 201, 409 request_in_progress or 503", i, h, h.raw)
			}
		}
		if j, dup := idOf[id]; dup {
			t.Errorf("keys %d and %d both answered withdrawal %s", j, i, id)
		}
		idOf[id] = i
	}
	if succeeded != n {
		t.Fatalf("%d of %d keys ended in a 201", succeeded, n)
	}
	if _, ok := idOf[heldID]; !ok {
		t.Errorf("no key was answered withdrawal %s, the one paid at the kill", heldID)
	}

	// The reconciler settles what the kill left pending.
	var wds []faultMovement
	for end := time.Now().Add(15 * time.Second); ; {
		wds = faultMovements(t, alice, "withdrawals")
		pending := 0
		for _, w := range wds {
			if w.Status == "pending" {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d withdrawals still pending (reconciler every 100 ms): %+v", pending, wds)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Each key's withdrawal listed once, and nothing else.
	if len(wds) != succeeded {
		t.Errorf("GET /api/v1/withdrawals lists %d; want %d, one per key", len(wds), succeeded)
	}
	listed := map[string]int{}
	var notFailed money.Amount
	for _, w := range wds {
		listed[w.ID]++
		i, ok := idOf[w.ID]
		switch {
		case !ok:
			t.Errorf("withdrawal %+v belongs to no key's answer", w)
		case w.Amount != amounts[i] || w.Status != "succeeded":
			t.Errorf("withdrawal %+v; want %s succeeded (the provider declines nothing)", w, amounts[i])
		}
		if w.Status != "failed" {
			a, _ := money.Parse(w.Amount)
			notFailed += a
		}
		faultExpectOp(t, sim, w.ID, psp.Payout, w.Amount, psp.Succeeded)
	}
	for id, c := range listed {
		if c != 1 {
			t.Errorf("withdrawal %s listed %d times", id, c)
		}
	}
	// The books: 1000.00 - 830.00.
	if want := (money.Amount(100000) - notFailed).String(); want != "170.00" {
		t.Errorf("deposits - withdrawals not failed = %s; want 170.00", want)
	}
	faultExpectBalance(t, alice, "170.00")
	led := faultLedger(t, alice, "170.00")
	refs := map[string]int{}
	for _, e := range led {
		refs[e.Kind+" "+e.Ref]++
		if e.Kind != "deposit" && e.Kind != "withdrawal" {
			t.Errorf("ledger entry %+v; want only the deposit and withdrawals", e)
		}
	}
	if len(led) != n+1 {
		t.Errorf("ledger has %d entries; want %d (1 deposit, %d withdrawals)", len(led), n+1, n)
	}
	for id := range idOf {
		if refs["withdrawal "+id] != 1 {
			t.Errorf("ledger has %d entries for withdrawal %s; want 1", refs["withdrawal "+id], id)
		}
	}
	// The provider: one payout per withdrawal, one charge.
	faultExpectMoved(t, sim, psp.Payout, n, "830.00")
	faultExpectMoved(t, sim, psp.Charge, 1, "1000.00")

	// And the restarted process stops cleanly.
	second.terminate(t)
}
