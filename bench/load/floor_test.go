package main

import (
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/sqldb"
)

// The floor's mint answers a signed token for a known account only, and its
// withdrawal takes a token only if it was signed for that account and
// purpose: the minted floor does the least a mint and its check can do, not
// nothing.
func TestFloorMint(t *testing.T) {
	db, err := sql.Open("sqlite", sqliteDSN(filepath.Join(t.TempDir(), "floor.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(floorSQLiteSchema); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(floorHandler(db, &sqldb.WriteGate{MaxGroup: 1}))
	defer srv.Close()
	do := func(method, path, bearer, key, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	session := func(name string) string {
		t.Helper()
		if st, b := do("POST", "/api/v1/users", "", "", `{"username":"`+name+`"}`); st != http.StatusCreated {
			t.Fatalf("sign-up %s: %d %s", name, st, b)
		}
		st, b := do("POST", "/api/v1/sessions", "", "", `{"username":"`+name+`"}`)
		var s struct{ Token string }
		if st != http.StatusCreated || json.Unmarshal([]byte(b), &s) != nil || s.Token == "" {
			t.Fatalf("session %s: %d %s", name, st, b)
		}
		if st, b := do("POST", "/api/v1/deposits", s.Token, "", `{"amount":"10.00"}`); st != http.StatusCreated {
			t.Fatalf("deposit %s: %d %s", name, st, b)
		}
		return s.Token
	}
	alice, bob := session("alice"), session("bob")
	mint := func(bearer string) string {
		t.Helper()
		st, b := do("POST", "/api/v1/submit-tokens", bearer, "", `{"purpose":"withdrawal"}`)
		var m struct {
			Token, Purpose string
			ExpiresAt      time.Time `json:"expires_at"`
		}
		if st != http.StatusCreated || json.Unmarshal([]byte(b), &m) != nil || !strings.HasPrefix(m.Token, "st_") || m.Purpose != "withdrawal" || !m.ExpiresAt.After(time.Now()) {
			t.Fatalf("mint: %d %s", st, b)
		}
		return m.Token
	}
	tok := mint(alice)
	if st, b := do("POST", "/api/v1/withdrawals", alice, tok, `{"amount":"1.00"}`); st != http.StatusCreated || !strings.Contains(b, `"status":"succeeded"`) {
		t.Errorf("withdrawal with alice's token: %d %s, want 201 succeeded", st, b)
	}
	for _, c := range []struct{ name, bearer, key string }{
		{"bob's token for alice", alice, mint(bob)},
		{"a forged token", alice, tok[:len(tok)-2] + "AA"},
	} {
		if st, b := do("POST", "/api/v1/withdrawals", c.bearer, c.key, `{"amount":"1.00"}`); st != http.StatusBadRequest || !strings.Contains(b, "submit_token_invalid") {
			t.Errorf("%s: %d %s, want 400 submit_token_invalid", c.name, st, b)
		}
	}
	for _, c := range []struct {
		name, bearer, body string
		want               int
	}{
		{"no session", "", `{"purpose":"withdrawal"}`, http.StatusUnauthorized},
		{"an unknown account", "fl_999", `{"purpose":"withdrawal"}`, http.StatusUnauthorized},
		{"another purpose", alice, `{"purpose":"deposit"}`, http.StatusBadRequest},
	} {
		if st, b := do("POST", "/api/v1/submit-tokens", c.bearer, "", c.body); st != c.want {
			t.Errorf("mint with %s: %d %s, want %d", c.name, st, b, c.want)
		}
	}
	var balance int64
	if err := db.QueryRow(`SELECT balance FROM accounts a JOIN users u ON u.aid = a.aid WHERE u.username = 'alice'`).Scan(&balance); err != nil || balance != 900 {
		t.Errorf("alice's balance = %d (%v), want 900: one withdrawal of 1.00 from 10.00", balance, err)
	}
}
