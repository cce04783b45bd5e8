package httpapi_test

import (
	"testing"
	"time"
)

// An expired session is no session (docs/api.md, step 1: no valid session
// → 401), also on the withdrawal route, whose principal comes from memory
// after the session's first request: a bad key or body answers 401, not
// the later step's 400, and carries no fresh submit token
// (Next-Submit-Token) minted for the session's user.
func TestExpiredSessionWithdrawalNoToken(t *testing.T) {
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) { c.App.SessionTTL = 1500 * time.Millisecond })
	tok := o.fundedToken(t)
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"1"}`); w.Code != 201 {
		t.Fatalf("withdrawal = %d %s", w.Code, w.Body)
	}
	time.Sleep(2 * time.Second)
	for _, c := range []struct{ key, body string }{
		{"plain-key", `{"amount":"1"}`}, // step 4: submit_token_required
		{"st_bogus", `{"amount":"1"}`},  // step 4: submit_token_invalid
		{`bad"key`, `{"amount":"1"}`},   // step 2: idempotency_key_invalid
		{tok, `{"amount":"oops"}`},      // step 3: invalid_amount
	} {
		w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", c.key, c.body)
		if w.Code != 401 || w.Header().Get("Next-Submit-Token") != "" {
			t.Errorf("expired session, key %q body %s: %d, Next-Submit-Token %q; want 401 unauthenticated and no token",
				c.key, c.body, w.Code, w.Header().Get("Next-Submit-Token"))
		}
	}
}
