package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/webhook"
	"github.com/onceguard/onceguard/webhook/webhooktest"
)

func TestOnceguard(t *testing.T) {
	webhooktest.Run(t, webhooktest.Scheme{
		New: func(secrets ...[]byte) webhook.Verifier { return webhook.Onceguard{Secrets: secrets} },
		Sign: func(secret []byte, at time.Time, body []byte) http.Header {
			return http.Header{webhook.OnceguardHeader: {webhook.Onceguard{}.Sign(secret, at, body)}}
		},
		Timestamped: true,
	})
}

// The header as the contract writes it, computed here independently.
func TestOnceguardContract(t *testing.T) {
	body := []byte(`{"id":"evt_1"}`)
	m := hmac.New(sha256.New, []byte("s3cret"))
	m.Write([]byte("1800000000." + string(body)))
	want := "t=1800000000,v1=" + hex.EncodeToString(m.Sum(nil))
	if got := (webhook.Onceguard{}).Sign([]byte("s3cret"), time.Unix(1800000000, 0), body); got != want {
		t.Fatalf("Sign = %q; want %q", got, want)
	}
	v := webhook.Onceguard{Secrets: [][]byte{[]byte("s3cret")}}
	// Two v1 values, one from a retired secret, and an unknown key: accepted.
	h := http.Header{webhook.OnceguardHeader: {"t=1800000000,v1=" + strings.Repeat("ab", 32) + "," + want[len("t=1800000000,"):] + ",v0=zz"}}
	if err := v.Verify(h, body, time.Unix(1800000000, 0)); err != nil {
		t.Errorf("Verify with an extra v1 and v0 = %v", err)
	}
	for _, bad := range []string{"v1=" + want[len("t=1800000000,v1="):], "t=1800000000", "t=1800000000,t=1800000000," + want[len("t=1800000000,"):], "t=-1,v1=00", "t=18e8," + want[len("t=1800000000,"):]} {
		if err := v.Verify(http.Header{webhook.OnceguardHeader: {bad}}, body, time.Unix(1800000000, 0)); !errors.Is(err, webhook.ErrInvalidSignature) {
			t.Errorf("header %q: Verify = %v; want ErrInvalidSignature", bad, err)
		}
	}
}

// GitHub's shape: X-Hub-Signature-256: sha256=<hex HMAC of the body>, no timestamp.
func TestHMACPrefixedHex(t *testing.T) {
	s := webhook.HMAC{SignatureHeader: "X-Hub-Signature-256", Prefix: "sha256="}
	webhooktest.Run(t, webhooktest.Scheme{
		New: func(secrets ...[]byte) webhook.Verifier { v := s; v.Secrets = secrets; return v },
		Sign: func(secret []byte, _ time.Time, body []byte) http.Header {
			return http.Header{"X-Hub-Signature-256": {s.Sign(secret, "", body)}}
		},
	})
}

// Slack's shape: v0=<hex HMAC("v0:" + ts + ":" + body)> with the time in its
// own header; here with SHA-512 and base64 to cover both options.
func TestHMACTimestampBase64(t *testing.T) {
	s := webhook.HMAC{
		SignatureHeader: "X-Signature", Prefix: "v0=", TimestampHeader: "X-Timestamp",
		Hash: sha512.New, Encoding: webhook.Base64, Tolerance: time.Minute,
		Payload: func(ts string, body []byte) []byte { return []byte("v0:" + ts + ":" + string(body)) },
	}
	webhooktest.Run(t, webhooktest.Scheme{
		New: func(secrets ...[]byte) webhook.Verifier { v := s; v.Secrets = secrets; return v },
		Sign: func(secret []byte, at time.Time, body []byte) http.Header {
			ts := strconv.FormatInt(at.Unix(), 10)
			return http.Header{"X-Signature": {s.Sign(secret, ts, body)}, "X-Timestamp": {ts}}
		},
		Timestamped: true,
		Tolerance:   time.Minute,
	})
}

func TestHandler(t *testing.T) {
	secret := []byte("s3cret")
	now := time.Unix(1_800_000_000, 0)
	var got []byte
	var rejected []error
	h := webhook.Handler(webhook.Config{
		Verifier: webhook.Onceguard{Secrets: [][]byte{secret}},
		MaxBody:  1 << 10,
		Now:      func() time.Time { return now },
		OnReject: func(_ *http.Request, err error) { rejected = append(rejected, err) },
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	send := func(body, sig string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/callbacks", strings.NewReader(body))
		if sig != "" {
			req.Header.Set(webhook.OnceguardHeader, sig)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	body := `{"id":"evt_1",  "type":"operation.succeeded"}` // spacing kept: the raw body is signed
	og := webhook.Onceguard{}
	if w := send(body, og.Sign(secret, now, []byte(body))); w.Code != http.StatusNoContent || string(got) != body {
		t.Fatalf("a signed callback: %d, the handler read %q; want 204 and the raw body", w.Code, got)
	}
	got = nil
	for _, tc := range []struct {
		name, body, sig, code string
		status                int
	}{
		{"unsigned", body, "", "invalid_signature", 401},
		{"forged", body, og.Sign([]byte("guess"), now, []byte(body)), "invalid_signature", 401},
		{"replayed after 5 minutes", body, og.Sign(secret, now.Add(-5*time.Minute-time.Second), []byte(body)), "signature_expired", 401},
		{"bit flipped", strings.Replace(body, "succeeded", "succeedee", 1), og.Sign(secret, now, []byte(body)), "invalid_signature", 401},
		{"too large", strings.Repeat("x", 1<<10+1), "t=1,v1=00", "body_too_large", 413},
	} {
		w := send(tc.body, tc.sig)
		if w.Code != tc.status || !strings.Contains(w.Body.String(), `"code":"`+tc.code+`"`) ||
			w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s; want %d problem+json %s", tc.name, w.Code, w.Body, tc.status, tc.code)
		}
		if got != nil {
			t.Errorf("%s: the handler ran", tc.name)
		}
	}
	if len(rejected) != 4 {
		t.Errorf("OnReject told %d refusals; want 4 (not the 413)", len(rejected))
	}
}

// Whatever the header and body, Verify never panics, and accepts only a
// header that carries the body's true signature at an acceptable time.
func FuzzOnceguardHeader(f *testing.F) {
	secret := []byte("s3cret")
	now := time.Unix(1_800_000_000, 0)
	og := webhook.Onceguard{Secrets: [][]byte{secret}}
	f.Add(og.Sign(secret, now, []byte(`{"id":"evt_1"}`)), []byte(`{"id":"evt_1"}`))
	f.Add("t=1800000000,v1=00,v1=", []byte(""))
	f.Add("t=,v1=,=,,", []byte("x"))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		err := og.Verify(http.Header{webhook.OnceguardHeader: {header}}, body, now)
		if err != nil && !errors.Is(err, webhook.ErrInvalidSignature) && !errors.Is(err, webhook.ErrSignatureExpired) {
			t.Fatalf("Verify = %v; want nil or one of the two errors", err)
		}
		if err != nil {
			return
		}
		// Accepted: some v1 must be the MAC of "<t>." + body under the secret.
		var ts string
		var sigs []string
		for _, part := range strings.Split(header, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
			if k == "t" {
				ts = v
			}
			if k == "v1" {
				sigs = append(sigs, v)
			}
		}
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(ts + "."))
		m.Write(body)
		want := m.Sum(nil)
		for _, s := range sigs {
			if b, err := hex.DecodeString(s); err == nil && hmac.Equal(b, want) {
				return
			}
		}
		t.Fatalf("accepted %q for body %q without its signature", header, body)
	})
}
