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

// keyLog sends every request and records its Idempotency-Key; with
// loseFirst it reports the first one's answer as a lost connection, as a
// proxy dropping it on the way back would.
type keyLog struct {
	loseFirst bool
	mu        sync.Mutex
	keys      []string
}

func (l *keyLog) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	l.keys = append(l.keys, r.Header.Get("Idempotency-Key"))
	first := len(l.keys) == 1
	l.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if l.loseFirst && first && err == nil {
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

	lose := &keyLog{loseFirst: true}
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

// The idempotent client with Offers against the service: each withdrawal's
// answer offers the next submit token, so four withdrawals mint one token;
// every key sent is a token, each used once, and the balance shows four
// debits.
func TestIdempotentClientOffers(t *testing.T) {
	base := startServe(t)
	alice := signUp(t, base, "olga")
	alice.expect(alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100"}`), 201, "")

	rec := &keyLog{}
	var mints int
	tr := &idemclient.Transport{
		Base:   rec,
		Offers: &idemclient.Offers{},
		NewKey: func(*http.Request) (string, error) { mints++; return alice.submitToken("withdrawal"), nil },
	}
	for _, amount := range []string{"1.00", "2.00", "3.00", "4.00"} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/api/v1/withdrawals", strings.NewReader(`{"amount":"`+amount+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+alice.token)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("withdraw %s: %v", amount, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || idemclient.Replayed(resp) {
			t.Fatalf("withdraw %s: %d %s; want a first 201", amount, resp.StatusCode, raw)
		}
	}
	keys := rec.keys
	seen := map[string]bool{}
	for _, k := range keys {
		if !strings.HasPrefix(k, "st_") || seen[k] {
			t.Fatalf("keys sent %v; want four distinct submit tokens", keys)
		}
		seen[k] = true
	}
	if len(keys) != 4 || mints != 1 {
		t.Errorf("%d attempts, %d tokens minted; want 4 attempts and 1 mint (the others offered)", len(keys), mints)
	}
	if acct := alice.do("GET", "/api/v1/account", "", ""); acct.body["balance"] != "90.00" {
		t.Errorf("balance = %v; want 90.00 (four debits: 1, 2, 3 and 4)", acct.body["balance"])
	}
}
