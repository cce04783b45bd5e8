// Package webhook verifies signed callbacks (webhooks) from a payment
// provider or any other sender, before anything acts on them.
//
// A Verifier checks one request's headers against its raw body: the bytes
// as they arrived, never a re-encoding of parsed JSON. Signatures are
// compared in constant time, several secrets can be valid at once (a
// rotation), and a timestamp outside the tolerance is refused, so a
// captured callback cannot be replayed later. Two schemes are here:
// Onceguard (t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">, the
// simulated provider's) and HMAC, a configurable scheme that covers the
// usual provider formats. Handler wraps an http.Handler with the check.
//
// A valid signature says who sent a callback, not that it is new: senders
// deliver at least once, so record each event id once, in the transaction
// that acts on it: idempotency.Once does that on any idempotency store,
// and sqlstore.Store.OnceTx in the SQL transaction of the effect.
package webhook

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/idempotency"
)

// DefaultTolerance is how far a callback's timestamp may be from the
// receiver's clock, either way.
const DefaultTolerance = 5 * time.Minute

// DefaultMaxBody bounds the body Handler reads.
const DefaultMaxBody = 64 << 10

var (
	// ErrInvalidSignature: the signature is missing, malformed, or made
	// with none of the secrets.
	ErrInvalidSignature = errors.New("webhook: invalid signature")
	// ErrSignatureExpired: the signature is valid but its timestamp is
	// outside the tolerance.
	ErrSignatureExpired = errors.New("webhook: signature expired")
)

// A Verifier checks a callback's signature against its raw body at time now.
// It returns nil, ErrInvalidSignature or ErrSignatureExpired; the signature
// is checked before the time, so a forgery is never reported as expired.
type Verifier interface {
	Verify(h http.Header, body []byte, now time.Time) error
}

// OnceguardHeader carries an Onceguard signature.
const OnceguardHeader = "Onceguard-Signature"

// Onceguard verifies the header Onceguard-Signature:
// t=<unix seconds>,v1=<lowercase hex HMAC-SHA256(secret, "<t>." + body)>.
// Several v1 values may be sent (one per secret during a rotation); other
// keys are ignored.
type Onceguard struct {
	Secrets   [][]byte      // any one of them may have signed; at least one
	Tolerance time.Duration // 0 means DefaultTolerance
}

// Sign returns the Onceguard-Signature value for body at t.
func (o Onceguard) Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(sha256.New, secret, ts, ".", body))
}

// Verify implements Verifier.
func (o Onceguard) Verify(h http.Header, body []byte, now time.Time) error {
	values := h.Values(OnceguardHeader)
	if len(values) != 1 {
		return ErrInvalidSignature
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(values[0], ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case !ok:
			return ErrInvalidSignature
		case k == "t":
			if ts != "" {
				return ErrInvalidSignature
			}
			ts = v
		case k == "v1":
			if sig, err := hex.DecodeString(v); err == nil && len(sig) == sha256.Size {
				sigs = append(sigs, sig)
			}
		}
	}
	t, ok := unixSeconds(ts)
	if !ok || len(sigs) == 0 || !anyMatch(o.Secrets, sigs, func(secret []byte) []byte {
		return mac(sha256.New, secret, ts, ".", body)
	}) {
		return ErrInvalidSignature
	}
	return fresh(t, now, o.Tolerance)
}

// Encoding is how HMAC writes a signature's bytes.
type Encoding int

// The encodings HMAC understands.
const (
	Hex    Encoding = iota // lowercase or uppercase hexadecimal
	Base64                 // standard base64 with padding
)

// HMAC verifies a signature header holding Prefix followed by the encoded
// HMAC of the payload, as many providers send, for example
//
//	X-Signature: sha256=<hex HMAC-SHA256(secret, body)>
//	X-Signature: v0=<hex HMAC-SHA256(secret, "v0:" + timestamp + ":" + body)>, with X-Timestamp
//
// With TimestampHeader set, the timestamp (unix seconds) is signed and must be
// within Tolerance; without it, nothing stops a replay of a captured
// callback, so record each event id once.
type HMAC struct {
	Secrets         [][]byte
	SignatureHeader string           // required
	Prefix          string           // before the encoded signature, e.g. "sha256="
	TimestampHeader string           // "" when the sender signs no time
	Hash            func() hash.Hash // nil means sha256.New
	Encoding        Encoding
	// Payload is what is signed; nil means "<timestamp>.<body>" with a
	// timestamp and the body alone without one.
	Payload   func(timestamp string, body []byte) []byte
	Tolerance time.Duration // 0 means DefaultTolerance
}

// Sign returns the signature header's value for body signed with timestamp
// ts ("" without a TimestampHeader).
func (s HMAC) Sign(secret []byte, ts string, body []byte) string {
	sum := s.mac(secret, ts, body)
	if s.Encoding == Base64 {
		return s.Prefix + base64.StdEncoding.EncodeToString(sum)
	}
	return s.Prefix + hex.EncodeToString(sum)
}

// Verify implements Verifier.
func (s HMAC) Verify(h http.Header, body []byte, now time.Time) error {
	values := h.Values(s.SignatureHeader)
	if s.SignatureHeader == "" || len(values) != 1 {
		return ErrInvalidSignature
	}
	encoded, ok := strings.CutPrefix(strings.TrimSpace(values[0]), s.Prefix)
	if !ok {
		return ErrInvalidSignature
	}
	var sig []byte
	var err error
	if s.Encoding == Base64 {
		sig, err = base64.StdEncoding.DecodeString(encoded)
	} else {
		sig, err = hex.DecodeString(encoded)
	}
	if err != nil || len(sig) == 0 {
		return ErrInvalidSignature
	}
	var ts string
	var t time.Time
	if s.TimestampHeader != "" {
		tv := h.Values(s.TimestampHeader)
		if len(tv) != 1 {
			return ErrInvalidSignature
		}
		ts = strings.TrimSpace(tv[0])
		if t, ok = unixSeconds(ts); !ok {
			return ErrInvalidSignature
		}
	}
	if !anyMatch(s.Secrets, [][]byte{sig}, func(secret []byte) []byte { return s.mac(secret, ts, body) }) {
		return ErrInvalidSignature
	}
	if s.TimestampHeader == "" {
		return nil
	}
	return fresh(t, now, s.Tolerance)
}

func (s HMAC) mac(secret []byte, ts string, body []byte) []byte {
	h := s.Hash
	if h == nil {
		h = sha256.New
	}
	switch {
	case s.Payload != nil:
		return mac(h, secret, "", "", s.Payload(ts, body))
	case s.TimestampHeader != "":
		return mac(h, secret, ts, ".", body)
	default:
		return mac(h, secret, "", "", body)
	}
}

// Config configures Handler. Verifier is required.
type Config struct {
	Verifier Verifier
	// MaxBody bounds the body read; larger is 413 body_too_large. 0 means
	// DefaultMaxBody.
	MaxBody int64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnReject, if set, is told each refused request's error, for logs and
	// metrics.
	OnReject func(r *http.Request, err error)
}

// Handler returns next guarded by the signature check. A request that fails
// it is answered 401 problem+json with code invalid_signature or
// signature_expired, and next does not run; next reads the same raw body
// the signature covered.
func Handler(cfg Config, next http.Handler) http.Handler {
	if cfg.Verifier == nil {
		panic("webhook: Config.Verifier is required")
	}
	maxBody := cfg.MaxBody
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err == nil && int64(len(body)) > maxBody {
			idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Title: "Request body too large"})
			return
		}
		if err == nil {
			err = cfg.Verifier.Verify(r.Header, body, now())
		} else {
			err = ErrInvalidSignature // a body cut short cannot be verified
		}
		if err != nil {
			if cfg.OnReject != nil {
				cfg.OnReject(r, err)
			}
			p := &idempotency.Problem{Status: http.StatusUnauthorized, Code: "invalid_signature", Title: "Invalid signature"}
			if errors.Is(err, ErrSignatureExpired) {
				p = &idempotency.Problem{Status: http.StatusUnauthorized, Code: "signature_expired", Title: "Signature expired",
					Detail: "the signature's timestamp is too far from the receiver's clock"}
			}
			idempotency.WriteProblem(w, p)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

func mac(h func() hash.Hash, secret []byte, ts, sep string, body []byte) []byte {
	m := hmac.New(h, secret)
	_, _ = io.WriteString(m, ts)
	_, _ = io.WriteString(m, sep)
	_, _ = m.Write(body)
	return m.Sum(nil)
}

// anyMatch reports whether any signature equals the MAC under any secret,
// comparing every pair in constant time.
func anyMatch(secrets, sigs [][]byte, sum func(secret []byte) []byte) bool {
	ok := false
	for _, secret := range secrets {
		if len(secret) == 0 {
			continue
		}
		want := sum(secret)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				ok = true
			}
		}
	}
	return ok
}

func unixSeconds(s string) (time.Time, bool) {
	if s == "" || len(s) > 12 || strings.TrimLeft(s, "0123456789") != "" {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

func fresh(t, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(t); d > tolerance || d < -tolerance {
		return ErrSignatureExpired
	}
	return nil
}
