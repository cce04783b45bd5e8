package obs_test

// Fuzz targets for the request id header and the log form of secrets.
//
//	go test -run XXX -fuzz FuzzRequestID -fuzztime 45s -parallel 1 ./internal/obs/

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
)

var safeIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// FuzzRequestID: whatever X-Request-Id holds (one header or two), the id
// the service logs and echoes is a safe token of 1..64 characters; a
// client's id is kept exactly when it already is one, else a fresh random
// one (16 hex digits) replaces it.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "abc-123_x.y", "has space", "<script>", "a\nb", "a\"b", "{\"level\":\"ERROR\"}", "é", "\x00",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "../../etc/passwd", "a%0Ab"} {
		f.Add(s, "", false)
		f.Add(s, "second", true)
	}
	f.Fuzz(func(t *testing.T, v, second string, two bool) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["X-Request-Id"] = []string{v}
		if two {
			r.Header["X-Request-Id"] = append(r.Header["X-Request-Id"], second)
		}
		id := obs.RequestID(r)
		if !safeIDRE.MatchString(id) {
			t.Fatalf("RequestID(%q) = %q: not a safe token", v, id)
		}
		if safeIDRE.MatchString(v) {
			if id != v {
				t.Fatalf("RequestID(%q) = %q; want the client's id kept", v, id)
			}
			return
		}
		if len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("RequestID(%q) = %q; want 16 fresh hex digits", v, id)
		}
		if again := obs.RequestID(r); again == id {
			t.Fatalf("RequestID(%q) gave %q twice; want a fresh random id", v, id)
		}
	})
}

// FuzzLogHash: a secret appears in logs as the first 12 hex digits of its
// SHA-256, never as itself; "" stays "".
func FuzzLogHash(f *testing.F) {
	for _, s := range []string{"", "st_secret", "k", strings.Repeat("k", 255), "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := obs.Hash(s)
		if s == "" {
			if h != "" {
				t.Fatalf(`Hash("") = %q; want ""`, h)
			}
			return
		}
		sum := sha256.Sum256([]byte(s))
		if h != hex.EncodeToString(sum[:6]) {
			t.Fatalf("Hash(%q) = %q; want the first 12 hex digits of its SHA-256", s, h)
		}
	})
}
