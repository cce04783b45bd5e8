package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
)

// stormCmdReport is the part of `onceguard storm --json` the tests read.
type stormCmdReport struct {
	Target             string `json:"target"`
	User               string `json:"user"`
	N                  int    `json:"n"`
	Amount             string `json:"amount"`
	Deposit            string `json:"deposit"`
	BalanceStart       string `json:"balance_start"`
	BalanceEnd         string `json:"balance_end"`
	ExpectedBalanceEnd string `json:"expected_balance_end"`
	LedgerSum          string `json:"ledger_sum"`
	LedgerEntries      int    `json:"ledger_entries"`
	Pass               bool   `json:"pass"`
	Checks             []struct {
		Check string `json:"check"`
		Pass  bool   `json:"pass"`
	} `json:"checks"`
	Scenarios []struct {
		Name    string `json:"name"`
		Sent    int    `json:"sent"`
		Answers []struct {
			Status   int    `json:"status"`
			Code     string `json:"code"`
			Replayed bool   `json:"replayed"`
			Count    int    `json:"count"`
		} `json:"answers"`
		MoneyMoved         string `json:"money_moved"`
		ExpectedMoneyMoved string `json:"expected_money_moved"`
		Checks             []struct {
			Check string `json:"check"`
			Pass  bool   `json:"pass"`
			Got   string `json:"got"`
			Want  string `json:"want"`
		} `json:"checks"`
		Pass bool `json:"pass"`
	} `json:"scenarios"`
}

// stormCmd runs `onceguard storm args...` in process.
func stormCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), append([]string{"storm"}, args...), func(string) string { return "" }, &out, &errOut)
	return out.String(), errOut.String(), err
}

// stormCmdJSON runs the storm with --json and decodes its report, counting
// each scenario's answers by "status code" ("201", "201 replayed",
// "429 duplicate_submission").
func stormCmdJSON(t *testing.T, args ...string) (stormCmdReport, map[string]map[string]int, error) {
	t.Helper()
	out, _, err := stormCmd(t, append(args, "--json")...)
	var rep stormCmdReport
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Fatalf("storm --json printed %q: %v (run error %v)", out, jerr, err)
	}
	counts := map[string]map[string]int{}
	for _, sc := range rep.Scenarios {
		counts[sc.Name] = map[string]int{}
		for _, a := range sc.Answers {
			key := strings.TrimSpace(strconv.Itoa(a.Status) + " " + a.Code)
			if a.Replayed {
				key += " replayed"
			}
			counts[sc.Name][key] += a.Count
		}
	}
	return rep, counts, err
}

// The storm against the service started in process: every scenario moves
// money exactly once, and the JSON says so in exact numbers.
func TestStormCommandJSON(t *testing.T) {
	base := startServe(t)
	rep, counts, err := stormCmdJSON(t, "--target", base, "--n", "20")
	if err != nil {
		t.Fatalf("storm = %v; want nil", err)
	}
	if !rep.Pass || rep.Target != base || rep.N != 20 || rep.Amount != "10.00" || !strings.HasPrefix(rep.User, "storm_") {
		t.Errorf("report = pass %v, target %q, n %d, amount %s, user %q; want pass true, %q, 20, 10.00, storm_...", rep.Pass, rep.Target, rep.N, rep.Amount, rep.User, base)
	}
	// 20 × (10.00 + 10.01 + 10.02): enough for every request to be paid.
	if rep.Deposit != "600.60" || rep.BalanceStart != "600.60" || rep.BalanceEnd != "570.57" || rep.ExpectedBalanceEnd != "570.57" ||
		rep.LedgerSum != "570.57" || rep.LedgerEntries != 4 {
		t.Errorf("money = deposit %s, balance %s -> %s (expected %s), ledger %s in %d entries; want 600.60, 600.60 -> 570.57 (570.57), 570.57 in 4",
			rep.Deposit, rep.BalanceStart, rep.BalanceEnd, rep.ExpectedBalanceEnd, rep.LedgerSum, rep.LedgerEntries)
	}
	if len(rep.Checks) != 3 {
		t.Errorf("overall checks = %d; want 3", len(rep.Checks))
	}
	for _, c := range rep.Checks {
		if !c.Pass {
			t.Errorf("overall check %q failed", c.Check)
		}
	}
	if len(rep.Scenarios) != 3 {
		t.Fatalf("scenarios = %d; want 3", len(rep.Scenarios))
	}
	moved := map[string]string{"a": "10.00", "b": "10.01", "c": "10.02"}
	for _, sc := range rep.Scenarios {
		sum := 0
		for _, a := range sc.Answers {
			sum += a.Count
		}
		if !sc.Pass || sc.Sent != 20 || sum != 20 || sc.MoneyMoved != moved[sc.Name] || sc.ExpectedMoneyMoved != moved[sc.Name] {
			t.Errorf("(%s) = pass %v, sent %d, %d answers, moved %s (expected %s); want pass, 20, 20, %s (%s)",
				sc.Name, sc.Pass, sc.Sent, sum, sc.MoneyMoved, sc.ExpectedMoneyMoved, moved[sc.Name], moved[sc.Name])
		}
		for _, c := range sc.Checks {
			if !c.Pass {
				t.Errorf("(%s) %s: got %s; want %s", sc.Name, c.Check, c.Got, c.Want)
			}
		}
	}
	// (a) one token: one fresh 201, the rest its replays or in progress.
	if a := counts["a"]; a["201"] != 1 || a["201 replayed"]+a["409 request_in_progress"] != 19 {
		t.Errorf("(a) answers = %v; want one 201, 19 replays or 409 request_in_progress", a)
	}
	// (b) 20 tokens, one body: one accepted, the rest the repeat window.
	if b := counts["b"]; b["201"] != 1 || b["429 duplicate_submission"] != 19 || len(b) != 2 {
		t.Errorf("(b) answers = %v; want 201:1, 429 duplicate_submission:19", b)
	}
	// (c) 20 keys, one order: paid once.
	if c := counts["c"]; c["201"] != 1 || c["409 order_already_paid"]+c["409 payment_in_progress"] != 19 {
		t.Errorf("(c) answers = %v; want one 201, 19 409 order_already_paid or payment_in_progress", c)
	}
	stormMetrics(t, base, 20, counts)
}

// stormMetrics checks that the service's /metrics after one storm of n
// (nothing else sent to it) count exactly what the storm's answers say.
// Every request of the storm carries a submit token: the deposit's, (a)'s
// one, (b)'s n, the order's and (c)'s n. A payment refused 409
// payment_in_progress frees its key and token (a retry runs again): its
// token is released, not consumed, and its lock acquire was busy. (b)'s
// duplicates are refused by the repeat window in the debit's transaction
// (withdrawals are Deferred), so each takes the user's lock, moving nothing;
// so does each replay of (a)'s finished key (the one after the storm too):
// a Deferred key is looked up in the debit's transaction, under the lock.
// (a)'s duplicates that arrive while it runs are refused 409 at once.
func stormMetrics(t *testing.T, base string, n int, counts map[string]map[string]int) {
	t.Helper()
	m := scrape(t, base)
	a, b, c := counts["a"], counts["b"], counts["c"]
	inProgress := float64(c["409 payment_in_progress"])
	replays := float64(a["201 replayed"]) + 1
	nf := float64(n)
	for _, x := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "issued"}, 2*nf + 3},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "consumed"}, 4 + nf - inProgress},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "released"}, inProgress},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "invalid"}, 0},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "new"}, nf + 4},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "replayed"}, replays}, // + the token once more after (a)
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "in_progress"}, float64(a["409 request_in_progress"])},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "duplicate_submission"}, float64(b["429 duplicate_submission"])},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "released"}, inProgress},
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "mismatch"}, 0},
		{"onceguard_repeat_window_rejections_total", map[string]string{"route": "/api/v1/withdrawals"}, nf - 1},
		{"onceguard_lock_acquires_total", map[string]string{"backend": "memory", "result": "acquired"}, 2 + nf - inProgress + replays},
		{"onceguard_lock_acquires_total", map[string]string{"backend": "memory", "result": "busy"}, inProgress},
		{"onceguard_lock_hold_seconds_count", map[string]string{"backend": "memory"}, 2 + nf - inProgress + replays},
		{"onceguard_lock_lost_total", map[string]string{"backend": "memory"}, 0},
		{"onceguard_money_movements_total", map[string]string{"kind": "deposit", "outcome": "succeeded"}, 1},
		{"onceguard_money_movements_total", map[string]string{"kind": "withdrawal", "outcome": "succeeded"}, 2},
		{"onceguard_money_movements_total", map[string]string{"kind": "payment", "outcome": "paid"}, 1},
		{"onceguard_money_movements_total", map[string]string{"kind": "payment", "outcome": "already_paid"}, float64(c["409 order_already_paid"])},
		{"onceguard_money_movements_total", map[string]string{"kind": "payment", "outcome": "in_progress"}, inProgress},
		{"onceguard_provider_duration_seconds_count", map[string]string{"op": "charge", "result": "ok"}, 1},
		{"onceguard_provider_duration_seconds_count", map[string]string{"op": "payout", "result": "ok"}, 2},
		{"onceguard_http_requests_total", map[string]string{"route": "/api/v1/withdrawals", "method": "POST", "code": "201"}, float64(a["201"] + a["201 replayed"] + 1 + b["201"])},
		{"onceguard_http_requests_total", map[string]string{"route": "/api/v1/withdrawals", "method": "POST", "code": "409"}, float64(a["409 request_in_progress"])},
		{"onceguard_http_requests_total", map[string]string{"route": "/api/v1/withdrawals", "method": "POST", "code": "429"}, float64(b["429 duplicate_submission"])},
		{"onceguard_http_requests_total", map[string]string{"route": "/api/v1/orders/{id}/payment", "method": "POST", "code": "201"}, float64(c["201"])},
		{"onceguard_http_requests_total", map[string]string{"route": "/api/v1/orders/{id}/payment", "method": "POST", "code": "409"}, nf - 1},
		{"onceguard_http_requests_total", map[string]string{"route": "/api/v1/submit-tokens", "method": "POST", "code": "201"}, 2*nf + 3},
	} {
		if got, _ := metricValue(m, x.name, x.labels); got != x.want {
			t.Errorf("after the storm: %s%v = %v; want %v (answers %v)", x.name, x.labels, got, x.want, counts)
		}
	}
}

// The table for people: a row per scenario with the money moved, the
// expectation and PASS; plain progress lines on a stderr that is not a
// terminal.
func TestStormCommandTable(t *testing.T) {
	base := startServe(t)
	out, errOut, err := stormCmd(t, "--target", base, "--n", "20", "--amount", "3.50")
	if err != nil {
		t.Fatalf("storm = %v; want nil\n%s", err, out)
	}
	for _, want := range []string{
		"(a) 1 submit token, 20 withdrawals",
		"(b) 20 submit tokens, one body",
		"(c) 20 keys, payments of one order",
	} {
		row := stormCmdRow(out, want)
		if row == nil {
			t.Errorf("no row %q in\n%s", want, out)
			continue
		}
		moved := map[byte]string{'a': "3.50", 'b': "3.51", 'c': "3.52"}[want[1]]
		n := len(row)
		if row[n-1] != "PASS" || row[n-2] != moved || row[n-3] != moved {
			t.Errorf("row %q = %q; want ... %s %s PASS", want, row, moved, moved)
		}
	}
	for _, want := range []string{
		// Not "201 (replayed)": whether any of (a)'s duplicates arrives
		// after the first finished (a replay) or during it (409) is timing.
		"SCENARIO", "429 duplicate_submission",
		"balance 210.60 -> 200.07 (expected 200.07); the ledger's 4 entries sum to 200.07",
		"PASS: every scenario moved money exactly once (60 storm requests",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+errOut, "\x1b") || strings.Contains(errOut, "\r") {
		t.Errorf("escape sequences or carriage returns written to a non-terminal: %q", errOut)
	}
	if !strings.Contains(errOut, "storm: (b) 20 submit tokens, one body: 20/20 in") {
		t.Errorf("stderr = %q; want a plain line per phase", errOut)
	}
}

// stormCmdRow returns the fields after the title of the table row that
// starts with title, or nil.
func stormCmdRow(out, title string) []string {
	for line := range strings.SplitSeq(out, "\n") {
		if rest, ok := strings.CutPrefix(line, title); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// A service without a repeat window lets (b)'s re-submits through: the
// storm sees every one of them debit, says FAIL, and returns an error.
func TestStormCommandFailsWithoutRepeatWindow(t *testing.T) {
	base := startServe(t, "--repeat-window", "0")
	rep, counts, err := stormCmdJSON(t, "--target", base, "--n", "20")
	if err == nil || !strings.Contains(err.Error(), "FAIL") || !strings.Contains(err.Error(), "(b)") {
		t.Errorf("storm = %v; want an error naming FAIL in (b)", err)
	}
	if rep.Pass || len(rep.Scenarios) != 3 {
		t.Fatalf("report pass %v, %d scenarios; want false, 3", rep.Pass, len(rep.Scenarios))
	}
	for _, sc := range rep.Scenarios {
		if sc.Pass != (sc.Name != "b") {
			t.Errorf("(%s) pass = %v; want %v", sc.Name, sc.Pass, sc.Name != "b")
		}
	}
	if b := rep.Scenarios[1]; counts["b"]["201"] != 20 || b.MoneyMoved != "200.20" || b.ExpectedMoneyMoved != "10.01" {
		t.Errorf("(b) = %v, moved %s (expected %s); want 20 201s moving 200.20 (expected 10.01)", counts["b"], b.MoneyMoved, b.ExpectedMoneyMoved)
	}
	out, _, err := stormCmd(t, "--target", base, "--n", "5")
	if err == nil || !strings.Contains(out, "FAIL (b) accepted (201): got 5; want 1") || !strings.Contains(out, "FAIL: money did not move exactly once") {
		t.Errorf("storm = %v, table:\n%s\nwant an error and the failed check named", err, out)
	}
}

// A target where nothing listens: an error that says how to start one,
// and no report.
func TestStormCommandUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := "http://" + ln.Addr().String()
	ln.Close()
	out, _, err := stormCmd(t, "--target", target, "--n", "5")
	if err == nil || !strings.Contains(err.Error(), "is the service running? start it with go run ./cmd/onceguard") || !strings.Contains(err.Error(), target) {
		t.Errorf("storm against %s = %v; want an error naming it and how to start the service", target, err)
	}
	if out != "" {
		t.Errorf("stdout = %q; want nothing", out)
	}
}

func TestStormCommandFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"n too small", []string{"--n", "1"}},
		{"bad amount", []string{"--amount", "1.234"}},
		{"zero amount", []string{"--amount", "0"}},
		{"amount over the max amount", []string{"--amount", "2000000"}},
		{"not a URL", []string{"--target", "127.0.0.1:8080"}},
		{"bad timeout", []string{"--timeout", "0s"}},
		{"deposit over the max amount", []string{"--n", "5000", "--amount", "100000"}},
		{"unknown flag", []string{"--nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The target does not listen: a flag error must come first.
			out, _, err := stormCmd(t, append([]string{"--target", "http://127.0.0.1:1"}, tc.args...)...)
			if err == nil || strings.Contains(err.Error(), "is the service running") || out != "" {
				t.Errorf("storm %q = %v, stdout %q; want a flag error and nothing printed", tc.args, err, out)
			}
		})
	}
}
