package idempotency_test

// More fuzz targets for Idempotency-Key handling, next to FuzzParseKey
// (fuzz_test.go, one header value): the header as it comes off the wire,
// several values, and the scoping of a key into its record id.
//
//	go test -run XXX -fuzz FuzzKeyHeaderWire -fuzztime 45s -parallel 1 ./idempotency/

import (
	"bufio"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
)

// keyRE is the contract's key syntax (docs/api.md): 1..255 characters
// from '!' to '~' without '"'.
var keyRE = regexp.MustCompile(`^[!#-~]{1,255}$`)

// refParseKey is an independent reading of the contract: absent or empty
// is missing, more than one header is invalid, a quoted string names the
// key inside it.
func refParseKey(values []string) (string, error) {
	switch {
	case len(values) == 0 || len(values) == 1 && values[0] == "":
		return "", idempotency.ErrKeyMissing
	case len(values) > 1:
		return "", idempotency.ErrKeyInvalid
	}
	k := values[0]
	if q, ok := strings.CutPrefix(k, `"`); ok {
		if q, ok = strings.CutSuffix(q, `"`); ok {
			k = q
		}
	}
	if !keyRE.MatchString(k) {
		return "", idempotency.ErrKeyInvalid
	}
	return k, nil
}

// FuzzParseKeyValues: ParseKey agrees with the reference on any list of
// up to three header values, with the same error.
func FuzzParseKeyValues(f *testing.F) {
	for _, s := range []string{"", "k", `"k"`, `""`, `"`, `"""`, `"k`, `k"`, `"k"k"`, " k", "k ", "a,b", "st_x", "é", "\x00",
		strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat("k", 255) + `"`, `"` + strings.Repeat("k", 256) + `"`} {
		f.Add(s, "", uint8(1))
		f.Add(s, s, uint8(2))
	}
	f.Add("a", "b", uint8(0))
	f.Add("a", "", uint8(3))
	f.Fuzz(func(t *testing.T, a, b string, n uint8) {
		values := []string{a, b, a}[:n%4]
		got, err := idempotency.ParseKey(values)
		want, wantErr := refParseKey(values)
		if got != want || !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
			t.Fatalf("ParseKey(%q) = %q, %v; want %q, %v", values, got, err, want, wantErr)
		}
		if err == nil {
			if again, err := idempotency.ParseKey([]string{`"` + got + `"`}); err != nil || again != got {
				t.Fatalf("quoted form of %q = %q, %v; want the same key", got, again, err)
			}
		}
	})
}

// FuzzKeyHeaderWire: header lines as a client sends them, read by
// net/http as the server does, then ParseKey: a key is accepted only when
// exactly one Idempotency-Key line (any case of its name) carries it, bare
// or quoted, whitespace around it aside; anything accepted is the
// contract's syntax.
func FuzzKeyHeaderWire(f *testing.F) {
	for _, s := range []string{
		"Idempotency-Key: abc",
		"idempotency-key: abc",
		"IDEMPOTENCY-KEY:abc",
		"Idempotency-Key: \"abc\"",
		"Idempotency-Key:   abc  \t",
		"Idempotency-Key: abc\r\nIdempotency-Key: abc",
		"Idempotency-Key: abc\r\nidempotency-key: def",
		"Idempotency-Key: a b",
		"Idempotency-Key: a,b",
		"Idempotency-Key: \"a\", \"b\"",
		"Idempotency-Key: abc\r\n def",
		"Idempotency-Key : abc",
		"Idempotency_Key: abc",
		"Idempotency-Key:",
		"Idempotency-Key: \"\"",
		"Idempotency-Key: st_abcdefghijklmnopqrstuvwxyz012345",
		"Idempotency-Key: \xc3\xa9",
		"Idempotency-Key: a\x00b",
		"Idempotency-Key: " + strings.Repeat("k", 255),
		"Idempotency-Key: " + strings.Repeat("k", 256),
		"Idempotency-Key: \"" + strings.Repeat("k", 255) + "\"",
		"X-Other: 1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, lines string) {
		raw := "POST /api/v1/deposits HTTP/1.1\r\nHost: example.test\r\n" + lines + "\r\n\r\n"
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // net/http refuses it before the service sees it
		}
		values := r.Header.Values("Idempotency-Key")
		key, err := idempotency.ParseKey(values)
		if errors.Is(err, idempotency.ErrKeyMissing) {
			if len(values) > 1 || len(values) == 1 && values[0] != "" {
				t.Fatalf("%q: ErrKeyMissing for values %q", lines, values)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, idempotency.ErrKeyInvalid) {
				t.Fatalf("%q: error %v matches neither ErrKeyMissing nor ErrKeyInvalid", lines, err)
			}
			return
		}
		if !keyRE.MatchString(key) {
			t.Fatalf("%q: accepted key %q outside the contract's syntax", lines, key)
		}
		// Exactly one header line names the key; its value, trimmed of
		// the whitespace HTTP allows around it, is the key or the key in
		// quotes.
		var logical []string // header lines with folded continuations joined, as net/http reads them
		for _, l := range strings.Split(raw, "\n")[1:] {
			l = strings.TrimSuffix(l, "\r")
			if l == "" {
				break // the end of the header section
			}
			if n := len(logical); n > 0 && (l[0] == ' ' || l[0] == '\t') {
				logical[n-1] += " " + strings.Trim(l, " \t") // obs-fold: one space in its place
				continue
			}
			logical = append(logical, l)
		}
		var found []string
		for _, l := range logical {
			name, val, ok := strings.Cut(l, ":")
			if ok && strings.EqualFold(name, "Idempotency-Key") {
				found = append(found, strings.Trim(val, " \t"))
			}
		}
		if len(found) != 1 || (found[0] != key && found[0] != `"`+key+`"`) {
			t.Fatalf("%q: key %q accepted, but the request's Idempotency-Key lines are %q", lines, key, found)
		}
	})
}

// FuzzRecordID: a key's record id is one hash of (principal, method,
// path, key), and two different requests never share one: the encoding
// is unambiguous whatever the path holds (it may hold a NUL: %00 is
// decoded), as long as principals are ids, methods are HTTP tokens and
// keys pass ParseKey.
func FuzzRecordID(f *testing.F) {
	f.Add("u_1", "POST", "/api/v1/orders/a/payment", "k", "u_1", "POST", "/api/v1/orders/b/payment", "k")
	f.Add("u_1", "POST", "/a\x00b", "c", "u_1", "POST", "/a", "b\x00c")
	f.Add("u_1", "POST", "/p", "k", "u_1POST", "", "/p", "k")
	f.Add("u_1", "POST", "/p\x00x", "k", "u_1", "POST", "/p", "x\x00k")
	f.Add("u", "POST", "/a|b", "c", "u", "POST", "/a", "b|c") // a printable separator would make these one
	f.Fuzz(func(t *testing.T, p1, m1, path1, k1, p2, m2, path2, k2 string) {
		valid := func(p, m, k string) bool {
			_, err := idempotency.ParseKey([]string{k})
			return err == nil && p != "" && !strings.ContainsRune(p, 0) && m != "" && strings.Trim(m, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == ""
		}
		if !valid(p1, m1, k1) || !valid(p2, m2, k2) {
			return
		}
		s1 := idempotency.Scope{Principal: p1, Method: m1, Path: path1}
		s2 := idempotency.Scope{Principal: p2, Method: m2, Path: path2}
		same := s1 == s2 && k1 == k2
		if (idempotency.RecordID(s1, k1) == idempotency.RecordID(s2, k2)) != same {
			t.Fatalf("RecordID(%+v, %q) vs RecordID(%+v, %q): equal ids = %v, same request = %v", s1, k1, s2, k2, !same, same)
		}
		if (s1.String() == s2.String()) != (s1 == s2) {
			t.Fatalf("Scope %+v vs %+v: String() equality disagrees with the scopes'", s1, s2)
		}
	})
}
