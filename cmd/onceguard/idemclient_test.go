package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/onceguard/onceguard/idempotency/idemclient"
)

// loseFirst sends every request but reports the first one's answer as a
// lost connection, as a proxy dropping it on the way back would.
type loseFirst struct {
	mu   sync.Mutex
	keys []string
}

func (l *loseFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	l.keys = append(l.keys, r.Header.Get("Idempotency-Key"))
	first := len(l.keys) == 1
	l.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if first && err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return resp, err
}

// The idempotent client against the service: a withdrawal whose answer is
// lost is retried with the same submit token and debits once; a second
// intent with the same body inside the window is refused 429 and not retried.
func TestIdempotentClient(t *testing.T) {
	base := startServe(t)
	alice := signUp(t, base, "clara")
	alice.expect(alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100"}`), 201, "")

	lose := &loseFirst{}
	tr := &idemclient.Transport{
		Base:   lose,
		NewKey: func(*http.Request) (string, error) { return alice.submitToken("withdrawal"), nil },
	}
	withdraw := func() (*http.Response, string) {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/api/v1/withdrawals", strings.NewReader(`{"amount":"30.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+alice.token)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("withdraw: %v", err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp, string(raw)
	}
	resp, body := withdraw()
	if resp.StatusCode != http.StatusCreated || !idemclient.Replayed(resp) {
		t.Fatalf("withdrawal after a lost answer: %d replayed=%v %s; want the stored 201", resp.StatusCode, idemclient.Replayed(resp), body)
	}
	if len(lose.keys) != 2 || lose.keys[0] != lose.keys[1] || !strings.HasPrefix(lose.keys[0], "st_") {
		t.Fatalf("attempts sent keys %v; want two attempts with one submit token", lose.keys)
	}
	acct := alice.do("GET", "/api/v1/account", "", "")
	if acct.body["balance"] != "70.00" {
		t.Errorf("balance = %v; want 70.00 (one debit of 30.00)", acct.body["balance"])
	}

	resp, body = withdraw()
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(body), &p)
	if resp.StatusCode != http.StatusTooManyRequests || p.Code != "duplicate_submission" {
		t.Fatalf("same body, new token, inside the window: %d %s; want 429 duplicate_submission", resp.StatusCode, body)
	}
	if len(lose.keys) != 3 {
		t.Errorf("%d attempts in all; want 3: a duplicate submission is not retried", len(lose.keys))
	}
	if acct := alice.do("GET", "/api/v1/account", "", ""); acct.body["balance"] != "70.00" {
		t.Errorf("balance = %v; want 70.00", acct.body["balance"])
	}
}
