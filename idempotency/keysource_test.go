package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// With KeyField, a header and a body field that name two keys are
// refused: if the header simply won, a client whose first attempt sent
// only the field (key t1) and whose retry adds a header (key h1) would
// The header wins over the body's field, as docs/gateway.md says. A retry
// that adds a header with another key to the field's first attempt is a
// second key for one intent: the repeat-submit window, whose fingerprint
// leaves the field out, turns it away.
func TestKeyFieldHeaderWins(t *testing.T) {
	c := &counting{status: 201}
	withoutField := func(_ *http.Request, body []byte) (string, error) {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return "", err
		}
		form.Del("withdraw_token")
		return form.Encode(), nil
	}
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, KeyField: "withdraw_token",
		Window: time.Minute, Fingerprint: withoutField})(c)
	const form = "application/x-www-form-urlencoded"
	if w := send(h, "", form, "amount=1&withdraw_token=t1"); w.Code != 201 {
		t.Fatalf("first, the field's key: %d", w.Code)
	}
	if w := send(h, "h1", form, "amount=1&withdraw_token=t1"); w.Code != 429 || codeOf(w) != "duplicate_submission" {
		t.Errorf("a header h1 with the field t1: %d %q; want h1 as the key, refused by the window (429 duplicate_submission)", w.Code, codeOf(w))
	}
	if w := send(h, "t1", form, "amount=1&withdraw_token=t1"); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("a header that names the field's key: %d %v; want the replay", w.Code, w.Header())
	}
	if w := send(h, "h2", form, "amount=2&withdraw_token=t1"); w.Code != 201 || w.Header().Get("Idempotent-Replayed") == "true" {
		t.Errorf("a header h2 with another body: %d %v; want a first run under h2", w.Code, w.Header())
	}
	if c.runs.Load() != 2 {
		t.Errorf("%d runs; want 2", c.runs.Load())
	}
}

// On a KeyOptional route, a key that is sent but empty (an empty header,
// an empty or null body field) is a client that meant to send one: it is
// refused, not run unprotected (every retry of it would run again).
func TestKeyOptionalEmptyKey(t *testing.T) {
	c := &counting{status: 201}
	var mu sync.Mutex
	var events []string
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, KeyOptional: true, KeyField: "withdraw_token",
		Fingerprint: func(_ *http.Request, body []byte) (string, error) { return string(body), nil },
		OnEvent:     func(_ *http.Request, ev string) { mu.Lock(); events = append(events, ev); mu.Unlock() }})(c)
	emptyHeader := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		r.Header["Idempotency-Key"] = []string{""}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for name, do := range map[string]func() *httptest.ResponseRecorder{
		"empty header":     emptyHeader,
		"empty JSON field": func() *httptest.ResponseRecorder { return send(h, "", "application/json", `{"withdraw_token":""}`) },
		"null JSON field":  func() *httptest.ResponseRecorder { return send(h, "", "application/json", `{"withdraw_token":null}`) },
		"empty form field": func() *httptest.ResponseRecorder {
			return send(h, "", "application/x-www-form-urlencoded", "withdraw_token=&amount=1")
		},
	} {
		if w := do(); w.Code != 400 || codeOf(w) != "idempotency_key_invalid" {
			t.Errorf("%s: %d %q; want 400 idempotency_key_invalid", name, w.Code, codeOf(w))
		}
	}
	if w := send(h, "", "application/json", `{"amount":1}`); w.Code != 201 {
		t.Errorf("no key at all: %d; want 201, unprotected", w.Code)
	}
	if c.runs.Load() != 1 {
		t.Errorf("%d runs; want 1 (the request without a key)", c.runs.Load())
	}
	// Without KeyOptional nothing changes: an empty header is missing.
	h = idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(c)
	if w := emptyHeader(); codeOf(w) != "idempotency_key_missing" {
		t.Errorf("empty header, key required: %q; want idempotency_key_missing", codeOf(w))
	}
}
