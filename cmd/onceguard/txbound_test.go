package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// A holder stopped (SIGSTOP) inside its debit transaction, on a connection
// opened as the service opens its own, costs another instance's withdrawal
// for the same user no more than about --lock-ttl: a clean 503 with a
// code or, once the server ended the holder's transaction, the withdrawal
// itself; not a wait for the request's deadline. The holder, resumed,
// finds its transaction ended: its debit never lands; balance and ledger
// are exact.
func TestServePausedHolderBoundedByLockTTL(t *testing.T) {
	const ttl = time.Second
	for name, db := range databases(t) {
		if name == "sqlite" { // one writer at a time: its busy timeout bounds a wait already
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dbArgs := db(t)
			t.Run("service", func(t *testing.T) { testPausedHolder(t, dbArgs, ttl, true) })
			t.Run("foreign", func(t *testing.T) { testPausedHolder(t, dbArgs, ttl, false) })
		})
	}
}

// testPausedHolder runs the test with a holder that opened its connection
// as the service does (bounded: the server ends its transaction) or as
// another program might (its idle bound an hour: only the waiter's lock
// wait bound answers, 503).
func testPausedHolder(t *testing.T, dbArgs []string, ttl time.Duration, bounded bool) {
	sim := &psp.Sim{}
	front := startFaultPSP(t, sim, 5*time.Second)
	// The request deadline (3/5 of the lease: 12 s) is well past the
	// bound, so only the bound can answer within it.
	base := startServe(t, append([]string{"--psp", front.url, "--lock-ttl", ttl.String(), "--key-lease", "20s",
		"--require-submit-token", "", "--repeat-window", "0"}, dbArgs...)...)
	user := "alice_" + map[bool]string{true: "service", false: "foreign"}[bounded]
	alice := signUp(t, base, user)
	alice.expect(alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100.00"}`), 201, "")

	holderTTL := time.Hour
	if bounded {
		holderTTL = ttl
	}
	h := startTxHolder(t, dbArgs[1], holderTTL, user)
	if err := syscall.Kill(h.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP holder: %v", err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(h.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()

	start := time.Now()
	a := alice.do("POST", "/api/v1/withdrawals", "wd-1", `{"amount":"30.00"}`)
	took := time.Since(start)
	t.Logf("withdrawal behind the stopped holder: %d %s in %v", a.status, a.raw, took.Round(time.Millisecond))
	// The server ends the holder's transaction and the waiter's wait
	// at about the same time: either it got the row, or a clean 503.
	if (!bounded || a.status != 201) && (a.status != 503 || a.body["code"] == nil || a.body["code"] == "") {
		t.Errorf("withdrawal behind the stopped holder = %d %s; want 201, or 503 with a code", a.status, a.raw)
	}
	if took > 4*ttl {
		t.Errorf("withdrawal behind the stopped holder answered after %v; want about --lock-ttl (%v)", took, ttl)
	}

	// Past the idle bound the server has ended the holder's transaction.
	time.Sleep(3 * ttl)
	if err := syscall.Kill(h.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT holder: %v", err)
	}
	stopped = false
	if !bounded {
		h.send(t, "rollback")
	} else if got := h.send(t, "commit"); got == "committed" {
		t.Errorf("resumed holder's commit = %q; want it refused (its transaction ended by the server)", got)
	}

	// The key was freed: its retry withdraws, once.
	w := a
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if w.status != 503 && w.status != 409 || time.Now().After(deadline) {
			break
		}
		w = alice.do("POST", "/api/v1/withdrawals", "wd-1", `{"amount":"30.00"}`)
	}
	if w.status != 201 {
		t.Fatalf("withdrawal retried = %d %s; want 201", w.status, w.raw)
	}
	id, _ := w.body["id"].(string)
	faultWaitMovement(t, alice, "withdrawals", id, "succeeded")
	faultExpectBalance(t, alice, "70.00")
	faultLedger(t, alice, "70.00")
	faultExpectMoved(t, sim, psp.Payout, 1, "30.00")
}

// txHolder is a child process holding a user's account row in an open
// transaction that debited it, on a connection opened by openDB.
type txHolder struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startTxHolder starts the holder on --db u and waits until it holds the row.
func startTxHolder(t *testing.T, u string, ttl time.Duration, user string) *txHolder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTxHolderProcess$")
	cmd.Env = append(os.Environ(), "ONCEGUARD_TX_HOLDER_DB="+u, "ONCEGUARD_TX_HOLDER_TTL="+ttl.String(), "ONCEGUARD_TX_HOLDER_USER="+user)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	h := &txHolder{cmd: cmd, in: in, out: bufio.NewReader(out)}
	if line := h.line(t); line != "held" {
		t.Fatalf("holder said %q; want held", line)
	}
	return h
}

func (h *txHolder) line(t *testing.T) string {
	t.Helper()
	for {
		s, err := h.out.ReadString('\n')
		if err != nil {
			t.Fatalf("holder: %v (read %q)", err, s)
		}
		if s = strings.TrimSpace(s); strings.HasPrefix(s, "holder: ") {
			return strings.TrimPrefix(s, "holder: ")
		}
	}
}

// send tells the holder to commit or roll back and returns what it said.
func (h *txHolder) send(t *testing.T, what string) string {
	t.Helper()
	if _, err := io.WriteString(h.in, what+"\n"); err != nil {
		t.Fatalf("holder: %v", err)
	}
	return h.line(t)
}

// TestTxHolderProcess is the holder when started by startTxHolder.
func TestTxHolderProcess(t *testing.T) {
	u := os.Getenv("ONCEGUARD_TX_HOLDER_DB")
	if u == "" {
		t.Skip("run by startTxHolder only")
	}
	ttl, err := time.ParseDuration(os.Getenv("ONCEGUARD_TX_HOLDER_TTL"))
	if err != nil {
		t.Fatal(err)
	}
	db, _, _, err := openDB(serveConfig{db: u, lockTTL: ttl, dbConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance - 10000, version = version + 1 WHERE user_id = (SELECT id FROM users WHERE username = '`+os.Getenv("ONCEGUARD_TX_HOLDER_USER")+`')`); err != nil {
		t.Fatal(err)
	}
	fmt.Println("holder: held")
	what, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	end := tx.Commit
	if strings.TrimSpace(what) == "rollback" {
		end = tx.Rollback
	}
	if err := end(); err != nil {
		fmt.Println("holder: refused:", strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	fmt.Println("holder: committed")
}

// boundTx appends the settings a URL does not name, and keeps those it does.
func TestBoundTx(t *testing.T) {
	set := map[string]string{"lock_timeout": "1000", "idle_in_transaction_session_timeout": "1000"}
	for in, want := range map[string]string{
		"postgres://h/db":                   "postgres://h/db?idle_in_transaction_session_timeout=1000&lock_timeout=1000",
		"postgres://h/db?sslmode=disable":   "postgres://h/db?sslmode=disable&idle_in_transaction_session_timeout=1000&lock_timeout=1000",
		"postgres://h/db?lock_timeout=5000": "postgres://h/db?lock_timeout=5000&idle_in_transaction_session_timeout=1000",
	} {
		if got := boundTx(in, set); got != want {
			t.Errorf("boundTx(%q) = %q; want %q", in, got, want)
		}
	}
}

// The service's PostgreSQL sessions carry its settings: transactions bounded by the lock TTL,
// and generic plans for its prepared statements (sqlstore.Store.BatchSettle); a setting the
// URL names is the operator's.
func TestPostgresSessionSettings(t *testing.T) {
	u := os.Getenv("ONCEGUARD_TEST_POSTGRES")
	if u == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES is not set")
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	for _, tc := range []struct {
		url, planCache string
	}{
		{u, "force_generic_plan"},
		{u + sep + "plan_cache_mode=auto", "auto"},
	} {
		db, _, _, err := openDB(serveConfig{db: tc.url, lockTTL: 3 * time.Second, dbConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		var planCache, lockTimeout string
		err = db.QueryRowContext(t.Context(), `SELECT current_setting('plan_cache_mode'), current_setting('lock_timeout')`).Scan(&planCache, &lockTimeout)
		_ = db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if planCache != tc.planCache || lockTimeout != "3s" {
			t.Errorf("%s: plan_cache_mode %q, lock_timeout %q; want %q, 3s", redactURL(tc.url), planCache, lockTimeout, tc.planCache)
		}
	}
}
