package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
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
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "consumed"}, eq(1), ""},
		{"onceguard_lock_acquires_total", map[string]string{"backend": "memory", "result": "acquired"}, eq(1), "one withdrawal ran"},
		{"onceguard_lock_hold_seconds_count", map[string]string{"backend": "memory"}, eq(1), ""},
		{"onceguard_money_movements_total", map[string]string{"kind": "withdrawal", "outcome": "succeeded"}, eq(1), "debited once"},
		{"onceguard_money_movements_total", map[string]string{"kind": "deposit", "outcome": "succeeded"}, eq(1), ""},
		{"onceguard_db_duration_seconds_count", map[string]string{"op": "withdraw"}, eq(1), ""},
		{"onceguard_provider_duration_seconds_count", map[string]string{"op": "payout", "result": "ok"}, eq(1), ""},
		{"onceguard_http_request_duration_seconds_count", map[string]string{"route": "/api/v1/deposits", "method": "POST"}, eq(1), ""},
	} {
		v, ok := metricValue(metrics, c.name, c.labels)
		if !ok || !c.want(v) {
			t.Errorf("%s%v = %v (found %v); want %s", c.name, c.labels, v, ok, c.says)
		}
	}
	replays, _ := metricValue(metrics, "onceguard_idempotency_outcomes_total", map[string]string{"outcome": "replayed"})
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

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

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
