package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"", "a", `"a"`, `""`, `"`, `"a`, `a"`, "a b", strings.Repeat("k", 256), "\x00", "é"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, k string, twice bool) {
		vals := []string{k}
		if twice {
			vals = append(vals, k)
		}
		got, err := idempotency.ParseKey(vals)
		if err != nil {
			return
		}
		if twice || got == "" || len(got) > idempotency.MaxKeyLen || strings.ContainsAny(got, "\" ") {
			t.Fatalf("ParseKey(%q) = %q, nil; want an error", vals, got)
		}
		// Bare and quoted forms name the same key.
		if again, err := idempotency.ParseKey([]string{`"` + got + `"`}); err != nil || again != got {
			t.Fatalf("quoted %q = %q, %v; want %q", got, again, err, got)
		}
	})
}

func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{``, `{}`, `[]`, `{"a":1,"b":[1,2,{"c":null}]}`, `{"b":2,"a":1}`, `{"a":1,"a":1}`, `"x"`, `1e400`, `[[[[[[[[[[[[`, `{"a":"\u00e9"}`, `{"a":1} {}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fp, err := idempotency.Fingerprint(body)
		if err != nil {
			// What encoding/json accepts is refused only for a repeated
			// member, depth, or invalid UTF-8 (which encoding/json replaces).
			if json.Valid(body) && !strings.Contains(err.Error(), "twice") && !strings.Contains(err.Error(), "deeper") && !strings.Contains(err.Error(), "UTF-8") {
				t.Fatalf("Fingerprint(%q) = %v for valid JSON", body, err)
			}
			return
		}
		if len(fp) != 64 {
			t.Fatalf("fingerprint %q; want 64 hex digits", fp)
		}
		// Whitespace around the body does not change it.
		if fp2, err := idempotency.Fingerprint(append(append([]byte(" \n"), body...), '\t')); err != nil || fp2 != fp {
			t.Fatalf("padded body: %q, %v; want %q", fp2, err, fp)
		}
		if len(bytes.TrimSpace(body)) == 0 {
			return // an empty body is allowed: the fingerprint of ""
		}
		// Only valid JSON is accepted, and the same value written another
		// way (encoding/json's member order, spacing and escapes) has the
		// same fingerprint.
		if !json.Valid(body) {
			t.Fatalf("Fingerprint(%q) accepted invalid JSON", body)
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("decode %q: %v", body, err)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if fp3, err := idempotency.Fingerprint(again); err != nil || fp3 != fp {
			t.Fatalf("re-encoded %q -> %q: %q, %v; want %q", body, again, fp3, err, fp)
		}
	})
}

// The whole middleware with random headers and bodies: never a panic,
// never a 5xx for bad input.
func FuzzMiddleware(f *testing.F) {
	f.Add("k", `{"amount":"1"}`, "alice", "POST")
	f.Add(`"k"`, `{`, "", "PUT")
	f.Add("", strings.Repeat("[", 100), "bob", "POST")
	f.Add("st_x", `{"a":1,"a":2}`, "alice", "DELETE")
	store := &memstore.Store{}
	h := idempotency.Middleware(idempotency.Config{
		Store: store, Windows: store, Window: 1e9,
		Principal: func(r *http.Request) (string, error) {
			if u := r.Header.Get("X-User"); u != "" {
				return u, nil
			}
			return "", errors.New("no user")
		},
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	f.Fuzz(func(t *testing.T, key, body, user, method string) {
		if !utf8.ValidString(method) || method == "" || strings.ContainsAny(method, " \t\r\n()<>@,;:\\\"/[]?={}") {
			method = "POST"
		}
		r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(body))
		r.Method = method
		r.Header["Idempotency-Key"] = []string{key}
		r.Header["X-User"] = []string{user}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("%s key=%q body=%q user=%q: %d %s", method, key, body, user, w.Code, w.Body)
		}
	})
}
