package httpapi_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// Failed sign-ins spread over many addresses reach the per-username limit
// (10 × 5), but that limit does not lock the owner out: the right password
// from an address with no failures of its own, or from one that signed in
// before, still signs in. A guesser is still stopped: an address that has
// failed is refused by the username's limit, and a fresh one gets one try.
func TestSignInNoLockoutByOthers(t *testing.T) {
	o := newObsHarness(t, nil, nil) // alice signed in from 192.0.2.1
	signIn := func(addr, pass string) (int, string) {
		r := httptest.NewRequest("POST", "/api/v1/sessions", strings.NewReader(`{"username":"alice","password":"`+pass+`"}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = addr + ":4000"
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		return w.Code, w.Body.String() + " Retry-After: " + w.Header().Get("Retry-After")
	}
	// The attack: 50 wrong passwords over 13 addresses (4 or fewer each,
	// under the per-pair and per-address limits).
	for i := range 50 {
		if code, body := signIn(fmt.Sprintf("203.0.113.%d", i%13+1), "wrong password"); code != 401 {
			t.Fatalf("wrong password %d = %d %s; want 401", i, code, body)
		}
	}
	// A guesser from an address that has failed is refused by the
	// username's limit, even with the right password.
	if code, body := signIn("203.0.113.1", "correct horse"); code != 429 || !strings.Contains(body, "too_many_attempts") {
		t.Errorf("a failed address's next attempt = %d %s; want 429 too_many_attempts", code, body)
	}
	// A fresh address gets one try, then the username's limit holds.
	if code, body := signIn("198.51.100.99", "wrong password"); code != 401 {
		t.Errorf("a fresh address's first guess = %d %s; want 401", code, body)
	}
	if code, body := signIn("198.51.100.99", "wrong password"); code != 429 {
		t.Errorf("its second guess = %d %s; want 429", code, body)
	}
	// The owner, from an address that never failed: signed in.
	if code, body := signIn("198.51.100.7", "correct horse"); code != 201 {
		t.Errorf("the owner's right password from a fresh address = %d %s; want 201", code, body)
	}
	// The owner from the address it signed in from before, after a typo
	// there: signed in too (the pair is known).
	if code, body := signIn("192.0.2.1", "typo password"); code != 401 {
		t.Errorf("the owner's typo = %d %s; want 401", code, body)
	}
	if code, body := signIn("192.0.2.1", "correct horse"); code != 201 {
		t.Errorf("the owner's right password from a known address after a typo = %d %s; want 201", code, body)
	}
}
