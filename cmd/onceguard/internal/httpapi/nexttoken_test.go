package httpapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// offered is the answer's Next-Submit-Token, checked against its expiry header: a token
// that expires within the harness's TokenTTL (a minute), or "" with no expiry header.
func offered(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	tok, exp := w.Header().Get("Next-Submit-Token"), w.Header().Get("Next-Submit-Token-Expires")
	if tok == "" {
		if exp != "" {
			t.Errorf("Next-Submit-Token-Expires %q without a token", exp)
		}
		return ""
	}
	if !strings.HasPrefix(tok, "st_") {
		t.Errorf("Next-Submit-Token = %q; want a submit token", tok)
	}
	at, err := time.Parse(time.RFC3339, exp)
	if left := time.Until(at); err != nil || left <= 0 || left > time.Minute+time.Second {
		t.Errorf("Next-Submit-Token-Expires = %q (%v); want RFC 3339, within the token TTL (1m)", exp, err)
	}
	return tok
}

// A money answer offers the next submit token for its route's purpose: the form's next
// submission needs no mint. It works once, like a minted one; a replay, a 5xx and a 401
// offer none, and neither does a plain key where tokens are not required.
func TestNextSubmitToken(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	tok := o.fundedToken(t) // balance 100.00
	issued := o.value(t, "onceguard_submit_tokens_total", "outcome", "issued")
	if got := o.value(t, "onceguard_submit_tokens_total", "outcome", "offered"); got != 0 {
		t.Fatalf("tokens offered before any money answer = %v; want 0", got)
	}

	first := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	next := offered(t, first)
	if first.Code != 201 || next == "" || next == tok {
		t.Fatalf("withdrawal = %d, next token %q (used %q); want 201 and a fresh token", first.Code, next, tok)
	}
	if got := o.value(t, "onceguard_submit_tokens_total", "outcome", "offered"); got != 1 {
		t.Errorf("tokens offered = %v; want 1", got)
	}
	if got := o.value(t, "onceguard_submit_tokens_total", "outcome", "issued"); got != issued {
		t.Errorf("tokens issued = %v; want %v (minted ones only)", got, issued)
	}

	// The replay answers the stored answer and nothing else.
	replay := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	if replay.Header().Get("Idempotent-Replayed") != "true" || replay.Body.String() != first.Body.String() {
		t.Fatalf("replay = %d %s; want the first answer replayed", replay.Code, replay.Body)
	}
	if got := offered(t, replay); got != "" {
		t.Errorf("replay offers %q; want no token", got)
	}

	// The offered token is a withdrawal token like a minted one: it moves money once.
	second := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", next, `{"amount":"20"}`)
	third := offered(t, second)
	if second.Code != 201 || third == "" || third == next {
		t.Fatalf("withdrawal with the offered token = %d %s, next %q", second.Code, second.Body, third)
	}
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", next, `{"amount":"21"}`); w.Code != 422 {
		t.Errorf("the offered token reused for another body = %d %s; want 422", w.Code, w.Body)
	}

	// A refusal that keeps the key (insufficient funds) needs a new token: offered.
	poor := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", third, `{"amount":"1000"}`)
	fourth := offered(t, poor)
	if poor.Code != 422 || fourth == "" {
		t.Fatalf("withdrawal over the balance = %d %s, next %q; want 422 and a token", poor.Code, poor.Body, fourth)
	}

	// A plain key where tokens are required: refused, with a token to submit with.
	plain := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", "plain-1", `{"amount":"1"}`)
	fifth := offered(t, plain)
	if plain.Code != 400 || fifth == "" {
		t.Fatalf("plain key = %d %s, next %q; want 400 submit_token_required and a token", plain.Code, plain.Body, fifth)
	}
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", fifth, `{"amount":"1"}`); w.Code != 201 {
		t.Errorf("withdrawal with the token offered with a 400 = %d %s", w.Code, w.Body)
	}

	// A plain key where tokens are not required: nothing offered. A deposit token: a
	// deposit token offered, which a withdrawal refuses.
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/deposits", "dep-plain", `{"amount":"1"}`); w.Code != 201 || offered(t, w) != "" {
		t.Errorf("deposit with a plain key = %d, next %q; want 201 and no token", w.Code, w.Header().Get("Next-Submit-Token"))
	}
	code, out, _ := o.call("POST", "/api/v1/submit-tokens", "", `{"purpose":"deposit"}`)
	dtok, _ := out["token"].(string)
	if code != 201 {
		t.Fatalf("deposit token = %d %v", code, out)
	}
	dep := serveJSON(o.h, o.token, "POST", "/api/v1/deposits", dtok, `{"amount":"1"}`)
	dnext := offered(t, dep)
	if dep.Code != 201 || dnext == "" {
		t.Fatalf("deposit with a token = %d %s, next %q", dep.Code, dep.Body, dnext)
	}
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", dnext, `{"amount":"1"}`); w.Code != 400 || !strings.Contains(w.Body.String(), "submit_token_invalid") {
		t.Errorf("withdrawal with an offered deposit token = %d %s; want 400 submit_token_invalid", w.Code, w.Body)
	}

	// No session: 401, nothing offered.
	if w := serveJSON(o.h, "", "POST", "/api/v1/withdrawals", fifth, `{"amount":"1"}`); w.Code != 401 || offered(t, w) != "" {
		t.Errorf("no session = %d, next %q; want 401 and no token", w.Code, w.Header().Get("Next-Submit-Token"))
	}

	// A 5xx frees the key and its token for the retry: nothing offered.
	o.locks.unavailable.Store(true)
	busy := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", fourth, `{"amount":"2"}`)
	o.locks.unavailable.Store(false)
	if busy.Code < 500 || offered(t, busy) != "" {
		t.Errorf("lock unavailable = %d %s, next %q; want a 5xx and no token", busy.Code, busy.Body, busy.Header().Get("Next-Submit-Token"))
	}
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", fourth, `{"amount":"2"}`); w.Code != 201 {
		t.Errorf("the retry after the 5xx = %d %s; want 201", w.Code, w.Body)
	}
}

// A quoted submit token (the draft's sf-string form) is a token too.
func TestNextSubmitTokenQuotedKey(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	tok := o.fundedToken(t)
	w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", `"`+tok+`"`, `{"amount":"1"}`)
	if w.Code != 201 || offered(t, w) == "" {
		t.Fatalf("withdrawal with a quoted token = %d %s, next %q; want 201 and a token", w.Code, w.Body, w.Header().Get("Next-Submit-Token"))
	}
	if got := o.value(t, "onceguard_submit_tokens_total", "outcome", "consumed"); got != 1 {
		t.Errorf("tokens consumed = %v; want 1 (a quoted token counted as a token)", got)
	}
}
