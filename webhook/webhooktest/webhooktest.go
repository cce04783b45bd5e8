// Package webhooktest is the conformance suite every webhook.Verifier runs.
package webhooktest

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/webhook"
)

// Scheme describes a signature scheme to the suite.
type Scheme struct {
	// New returns a verifier that accepts signatures made with any of secrets.
	New func(secrets ...[]byte) webhook.Verifier
	// Sign returns the headers a sender adds to body, signed with secret at t.
	Sign func(secret []byte, t time.Time, body []byte) http.Header
	// Timestamped says the scheme signs the time, so old callbacks are refused.
	Timestamped bool
	// Tolerance is the verifier's; 0 means webhook.DefaultTolerance.
	Tolerance time.Duration
}

// Run checks that s accepts what its sender signs and refuses forgeries,
// tampered bodies, mangled headers and, when timestamped, stale callbacks.
func Run(t *testing.T, s Scheme) {
	secret, other := []byte("whsec_primary"), []byte("whsec_rotated")
	now := time.Unix(1_800_000_000, 0)
	tol := s.Tolerance
	if tol == 0 {
		tol = webhook.DefaultTolerance
	}
	body := []byte(`{"id":"evt_1","type":"operation.succeeded","operation":{"key":"wd_1","amount":"10.00"}}`)
	v := s.New(secret)
	expect := func(t *testing.T, h http.Header, b []byte, at time.Time, want error) {
		t.Helper()
		if err := v.Verify(h, b, at); !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("Verify = %v; want %v", err, want)
		}
	}

	t.Run("Valid", func(t *testing.T) {
		expect(t, s.Sign(secret, now, body), body, now, nil)
		expect(t, s.Sign(secret, now, nil), nil, now, nil)
		big := bytes.Repeat([]byte("x"), 1<<20)
		expect(t, s.Sign(secret, now, big), big, now, nil)
	})
	t.Run("TamperedBody", func(t *testing.T) {
		h := s.Sign(secret, now, body)
		for _, i := range []int{0, len(body) / 2, len(body) - 1} {
			for _, bit := range []byte{1, 0x80} {
				b := bytes.Clone(body)
				b[i] ^= bit
				expect(t, h, b, now, webhook.ErrInvalidSignature)
			}
		}
		expect(t, h, append(bytes.Clone(body), ' '), now, webhook.ErrInvalidSignature)
		expect(t, h, body[:len(body)-1], now, webhook.ErrInvalidSignature)
	})
	t.Run("WrongSecret", func(t *testing.T) {
		expect(t, s.Sign([]byte("whsec_guess"), now, body), body, now, webhook.ErrInvalidSignature)
		expect(t, s.Sign(nil, now, body), body, now, webhook.ErrInvalidSignature)
		if err := s.New().Verify(s.Sign(secret, now, body), body, now); !errors.Is(err, webhook.ErrInvalidSignature) {
			t.Errorf("a verifier without secrets: Verify = %v; want ErrInvalidSignature", err)
		}
	})
	t.Run("Rotation", func(t *testing.T) {
		both := s.New(other, secret)
		for _, sec := range [][]byte{secret, other} {
			if err := both.Verify(s.Sign(sec, now, body), body, now); err != nil {
				t.Errorf("secret %q during a rotation: Verify = %v", sec, err)
			}
		}
	})
	t.Run("MangledHeaders", func(t *testing.T) {
		signed := s.Sign(secret, now, body)
		for name, values := range signed {
			mangle := map[string]func(string) string{
				"removed":   nil,
				"empty":     func(string) string { return "" },
				"truncated": func(v string) string { return v[:len(v)-1] },
				"extended":  func(v string) string { return v + "0" },
				"last char": func(v string) string { return v[:len(v)-1] + string(v[len(v)-1]^1) },
				"spaces":    func(v string) string { return strings.ReplaceAll(v, "=", " = ") + " x" },
			}
			for how, f := range mangle {
				h := signed.Clone()
				if f == nil {
					h.Del(name)
				} else {
					h.Set(name, f(values[0]))
				}
				if err := v.Verify(h, body, now); err == nil {
					t.Errorf("header %s %s (%q): accepted", name, how, h.Get(name))
				}
			}
			h := signed.Clone()
			h.Add(name, values[0]+"0")
			if err := v.Verify(h, body, now); err == nil {
				t.Errorf("header %s sent twice: accepted", name)
			}
		}
		expect(t, http.Header{}, body, now, webhook.ErrInvalidSignature)
	})
	if !s.Timestamped {
		return
	}
	t.Run("Tolerance", func(t *testing.T) {
		for _, d := range []time.Duration{tol - time.Second, -tol + time.Second} {
			expect(t, s.Sign(secret, now.Add(-d), body), body, now, nil)
		}
		for _, d := range []time.Duration{tol + time.Second, -tol - time.Second, 24 * time.Hour} {
			expect(t, s.Sign(secret, now.Add(-d), body), body, now, webhook.ErrSignatureExpired)
		}
		// A forgery is refused as such, never as expired.
		expect(t, s.Sign([]byte("whsec_guess"), now.Add(-time.Hour), body), body, now, webhook.ErrInvalidSignature)
	})
}
