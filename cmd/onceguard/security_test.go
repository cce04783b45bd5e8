package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// raw sends one request with extra headers and returns status, headers
// and body.
func raw(t *testing.T, method, url, body string, headers map[string]string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func login(t *testing.T, base, user, pass, addr string) (int, string) {
	t.Helper()
	status, h, body := raw(t, "POST", base+"/api/v1/sessions", fmt.Sprintf(`{"username":%q,"password":%q}`, user, pass), map[string]string{"X-Real-IP": addr})
	if status == 429 && (h.Get("Retry-After") == "" || !strings.Contains(body, `"code":"too_many_attempts"`)) {
		t.Errorf("429 without Retry-After or code: %v %s", h, body)
	}
	return status, body
}

// Brute force: failed sign-ins are limited per (username, address), per
// address and per username, before the password hash is computed.
func TestServeLoginLimits(t *testing.T) {
	// 2 per pair, 8 per address, 20 per username; addresses from a
	// trusted proxy header, so the test can be many clients.
	base := startServe(t, "--login-attempts", "2", "--client-ip-header", "X-Real-IP")
	signUp(t, base, "alice")
	signUp(t, base, "bob")

	// Per (user, address): the third try is refused, even with the right
	// password; another address, or another user, is not.
	for i := range 2 {
		if s, _ := login(t, base, "alice", "wrong password", "10.0.0.1"); s != 401 {
			t.Fatalf("wrong password #%d = %d; want 401", i+1, s)
		}
	}
	if s, _ := login(t, base, "alice", "correct horse", "10.0.0.1"); s != 429 {
		t.Errorf("right password after 2 failures from one address = %d; want 429 too_many_attempts", s)
	}
	if s, _ := login(t, base, "alice", "correct horse", "10.0.0.2"); s != 201 {
		t.Errorf("alice from another address = %d; want 201", s)
	}
	if s, _ := login(t, base, "bob", "correct horse", "10.0.0.1"); s != 201 {
		t.Errorf("bob from the same address = %d; want 201", s)
	}

	// Per address: 8 failures over any usernames stop the address.
	for i := range 6 { // 2 already counted above
		if s, _ := login(t, base, fmt.Sprintf("nobody%d", i), "guess guess", "10.0.0.1"); s != 401 {
			t.Fatalf("unknown user #%d = %d; want 401", i, s)
		}
	}
	if s, _ := login(t, base, "bob", "correct horse", "10.0.0.1"); s != 429 {
		t.Errorf("bob from an address with 8 failures = %d; want 429", s)
	}

	// Per username: 20 failures from 20 addresses (a distributed guess)
	// stop the username at every address that has failed, but not the
	// owner at an address with no failures of its own (no lockout).
	for i := range 20 {
		login(t, base, "bob", "wrong password", fmt.Sprintf("10.1.0.%d", i))
	}
	if s, _ := login(t, base, "bob", "correct horse", "10.1.0.1"); s != 429 {
		t.Errorf("bob after 20 failures, from one of their addresses = %d; want 429", s)
	}
	if s, _ := login(t, base, "bob", "correct horse", "10.2.0.2"); s != 201 {
		t.Errorf("bob after 20 failures, from a fresh address = %d; want 201", s)
	}
	// alice is unaffected by bob's lockout.
	if s, _ := login(t, base, "alice", "correct horse", "10.2.0.1"); s != 201 {
		t.Errorf("alice from a fresh address = %d; want 201", s)
	}
}

// Account spam: sign-ups are limited per client address and hour; a
// taken username counts (it cost a hash), a malformed one does not, and
// another address is not affected.
func TestServeSignupLimit(t *testing.T) {
	base := startServe(t, "--signup-limit", "2", "--client-ip-header", "X-Real-IP")
	signup := func(name, addr string) (int, http.Header, string) {
		t.Helper()
		return raw(t, "POST", base+"/api/v1/users", fmt.Sprintf(`{"username":%q,"password":"correct horse"}`, name), map[string]string{"X-Real-IP": addr})
	}
	if s, _, body := signup("Not Valid", "10.0.0.1"); s != 400 || !strings.Contains(body, "invalid_username") {
		t.Fatalf("malformed username = %d %s; want 400 invalid_username", s, body)
	}
	if s, _, body := signup("spam1", "10.0.0.1"); s != 201 {
		t.Fatalf("first sign-up = %d %s; want 201", s, body)
	}
	if s, _, body := signup("spam1", "10.0.0.1"); s != 409 {
		t.Fatalf("taken username = %d %s; want 409", s, body)
	}
	s, h, body := signup("spam2", "10.0.0.1")
	if s != 429 || !strings.Contains(body, `"code":"too_many_signups"`) || h.Get("Retry-After") == "" || !strings.HasPrefix(h.Get("Content-Type"), "application/problem+json") {
		t.Errorf("third sign-up from one address = %d %v %s; want 429 too_many_signups with Retry-After", s, h, body)
	}
	// Another address is not affected, and the refused attempt created
	// nothing: spam2 is still free.
	if s, _, body := signup("spam2", "10.0.0.2"); s != 201 {
		t.Errorf("sign-up from another address = %d %s; want 201", s, body)
	}
}

// A client address over the rate limit gets 429 rate_limited with
// Retry-After; health checks are never limited.
func TestServeRateLimit(t *testing.T) {
	base := startServe(t, "--rate-limit", "1", "--rate-burst", "5")
	codes := map[int]int{}
	for range 8 {
		s, h, body := raw(t, "GET", base+"/api/v1/account", "", nil)
		codes[s]++
		if s == 429 && (h.Get("Retry-After") == "" || !strings.Contains(body, `"code":"rate_limited"`)) {
			t.Errorf("429 = %v %s; want Retry-After and code rate_limited", h, body)
		}
	}
	if codes[401] != 5 || codes[429] != 3 {
		t.Errorf("8 requests with a burst of 5 = %v; want five 401 and three 429", codes)
	}
	for range 10 {
		if s, _, _ := raw(t, "GET", base+"/healthz", "", nil); s != 200 {
			t.Fatalf("healthz under the limit = %d; want 200", s)
		}
	}
}

// Sessions: a token the client brought is never adopted (fixation), logout
// ends the session for the cookie too, a key replay re-checks the session,
// and keys are per user.
func TestServeSessionsAndScopes(t *testing.T) {
	base := startServe(t)
	alice := signUp(t, base, "alice")
	bob := signUp(t, base, "bob")

	// Fixation: sign in carrying a planted cookie and bearer token.
	const planted = "attacker-chosen-session-token-0123456789abcdef"
	s, h, body := raw(t, "POST", base+"/api/v1/sessions", `{"username":"alice","password":"correct horse"}`,
		map[string]string{"Cookie": "onceguard_session=" + planted, "Authorization": "Bearer " + planted})
	if s != 201 || strings.Contains(body, planted) || strings.Contains(h.Get("Set-Cookie"), planted) {
		t.Errorf("sign-in with a planted token = %d %s %v; want a new token", s, body, h.Get("Set-Cookie"))
	}
	if s, _, _ := raw(t, "GET", base+"/api/v1/account", "", map[string]string{"Authorization": "Bearer " + planted}); s != 401 {
		t.Errorf("the planted token after sign-in = %d; want 401", s)
	}

	// Keys are scoped to the user: the same key and body for two users
	// are two deposits, and bob never sees alice's stored answer.
	a := alice.do("POST", "/api/v1/deposits", "same-key", `{"amount":"5"}`)
	b := bob.do("POST", "/api/v1/deposits", "same-key", `{"amount":"5"}`)
	if a.status != 201 || b.status != 201 || a.body["id"] == b.body["id"] || b.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("one key, two users = %d %v / %d %v (replayed %q); want two deposits", a.status, a.body["id"], b.status, b.body["id"], b.header.Get("Idempotent-Replayed"))
	}

	// A replay needs a live session: after logout the stored answer is not
	// handed out, by bearer or by cookie.
	cookie := map[string]string{"Cookie": "onceguard_session=" + alice.token, "Idempotency-Key": "same-key"}
	if s, h, _ := raw(t, "POST", base+"/api/v1/deposits", `{"amount":"5"}`, cookie); s != 201 || h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay by cookie before logout = %d %q; want the replay", s, h.Get("Idempotent-Replayed"))
	}
	alice.expect(alice.do("DELETE", "/api/v1/sessions/current", "", ""), 204, "")
	alice.expect(alice.do("POST", "/api/v1/deposits", "same-key", `{"amount":"5"}`), 401, "unauthenticated")
	if s, _, _ := raw(t, "POST", base+"/api/v1/deposits", `{"amount":"5"}`, cookie); s != 401 {
		t.Errorf("replay by cookie after logout = %d; want 401", s)
	}
	if a := bob.do("GET", "/api/v1/account", "", ""); a.body["balance"] != "5.00" {
		t.Errorf("bob's balance = %v; want 5.00 (alice's logout touched only her session)", a.body["balance"])
	}
}

// Nothing can be cancelled or deleted across users: the only DELETE
// route is DELETE /api/v1/sessions/current, which ends the caller's own
// session (the one its credential names). Bob aims DELETE at alice's
// session token, order, payment, deposit and submit token: 404 or 405,
// and afterwards alice is still signed in, her order still open and her
// token still good. Bob's own logout leaves alice's session alone.
func TestServeNoCrossUserDelete(t *testing.T) {
	base := startServe(t)
	alice := signUp(t, base, "alice")
	bob := signUp(t, base, "bob")
	dep := alice.do("POST", "/api/v1/deposits", "d1", `{"amount":"20"}`)
	alice.expect(dep, 201, "")
	depID, _ := dep.body["id"].(string)
	ord := alice.do("POST", "/api/v1/orders", "o1", `{"amount":"5","description":"tea"}`)
	alice.expect(ord, 201, "")
	ordID, _ := ord.body["id"].(string)
	tok := alice.submitToken("payment")

	for _, c := range []struct {
		path   string
		status int
		code   string
	}{
		{"/api/v1/sessions/" + alice.token, 404, "not_found"},
		{"/api/v1/sessions", 405, "method_not_allowed"},
		{"/api/v1/orders/" + ordID, 405, "method_not_allowed"},
		{"/api/v1/orders/" + ordID + "/payment", 405, "method_not_allowed"},
		{"/api/v1/orders", 405, "method_not_allowed"},
		{"/api/v1/deposits/" + depID, 405, "method_not_allowed"},
		{"/api/v1/submit-tokens", 405, "method_not_allowed"},
		{"/api/v1/submit-tokens/" + tok, 404, "not_found"},
		{"/api/v1/users", 405, "method_not_allowed"},
	} {
		a := bob.do("DELETE", c.path, "", "")
		bob.expect(a, c.status, c.code)
		if c.status == 405 && strings.Contains(a.header.Get("Allow"), "DELETE") {
			t.Errorf("DELETE %s: Allow %q offers DELETE", c.path, a.header.Get("Allow"))
		}
	}
	bob.expect(bob.do("DELETE", "/api/v1/sessions/current", "", ""), 204, "")
	bob.expect(bob.do("GET", "/api/v1/account", "", ""), 401, "unauthenticated")

	alice.expect(alice.do("GET", "/api/v1/account", "", ""), 200, "")
	if o := alice.do("GET", "/api/v1/orders/"+ordID, "", ""); o.body["status"] != "created" {
		t.Errorf("alice's order after bob's DELETEs = %s; want still created", o.raw)
	}
	alice.expect(alice.do("POST", "/api/v1/orders/"+ordID+"/payment", tok, `{"method":"wallet"}`), 201, "")
}

// Size limits: a body over 64 KiB is 413 on every route, headers over
// 32 KiB are refused by the server.
func TestServeSizeLimits(t *testing.T) {
	base := startServe(t)
	big := `{"username":"` + strings.Repeat("a", 70<<10) + `","password":"x"}`
	if s, _, body := raw(t, "POST", base+"/api/v1/users", big, nil); s != 413 || !strings.Contains(body, "body_too_large") {
		t.Errorf("70 KiB sign-up = %d %s; want 413 body_too_large", s, body)
	}
	if s, _, _ := raw(t, "GET", base+"/healthz", "", map[string]string{"X-Padding": strings.Repeat("p", 64<<10)}); s != 431 {
		t.Errorf("64 KiB header = %d; want 431", s)
	}
}
