package httpapi_test

// Fuzz targets for the request-body rules every endpoint shares
// (decode.go): strict JSON, duplicate and unknown members, depth, size.
//
//	go test -run XXX -fuzz FuzzDecode -fuzztime 45s -parallel 1 ./internal/httpapi/

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
)

// The request bodies of the API, as the handlers declare them.
type (
	orderBody struct {
		Amount      json.RawMessage `json:"amount"`
		Description *string         `json:"description"`
	}
	credentialsBody struct {
		Username *string `json:"username"`
		Password *string `json:"password"`
	}
	purposeBody struct {
		Purpose *string `json:"purpose"`
	}
	methodBody struct {
		Method *string `json:"method"`
	}
)

var bodyKinds = []struct {
	new    func() any
	fields []string
}{
	{func() any { return new(orderBody) }, []string{"amount", "description"}},
	{func() any { return new(credentialsBody) }, []string{"username", "password"}},
	{func() any { return new(purposeBody) }, []string{"purpose"}},
	{func() any { return new(methodBody) }, []string{"method"}},
}

// members reads body (valid JSON) with encoding/json's tokenizer and
// returns the names of the top-level object's members and whether any
// object, at any depth, repeats a member name.
func members(body []byte) (top []string, dup bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		obj     bool
		wantKey bool
		seen    map[string]bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return top, dup
		}
		var f *frame
		if len(stack) > 0 {
			f = stack[len(stack)-1]
		}
		if f != nil && f.obj && f.wantKey {
			if name, ok := tok.(string); ok {
				if f.seen[name] {
					dup = true
				}
				f.seen[name] = true
				if len(stack) == 1 {
					top = append(top, name)
				}
				f.wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, wantKey: true, seen: map[string]bool{}})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object wants its next key.
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].wantKey = true
		}
	}
}

// tolerateCaseFoldedMembers: KNOWN BUG, reported, not fixed yet. Decode
// uses encoding/json, which matches member names case-insensitively
// (with Unicode folding: "ſ" is "s", "K" is "k"), so {"AMOUNT":"5"} is
// read as amount 5, and {"amount":"1","Amount":"999"} as amount 999
// although its "amount" member says 1; the contract makes an unknown
// member 400 invalid_request. Set this to false once Decode matches names
// exactly: FuzzDecode's seeds then guard the fix.
const tolerateCaseFoldedMembers = false

func foldsToAny(name string, fields []string) bool {
	for _, f := range fields {
		if strings.EqualFold(name, f) {
			return true
		}
	}
	return false
}

// FuzzDecode: Decode answers nil or a 400 invalid_json / invalid_request,
// never panics, and accepts only one JSON value, an object (or null),
// with no member repeated at any depth and only the declared members,
// spelt exactly.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"amount":"1.00"}`, `{"amount":1,"description":"x"}`, ` {"amount":"7"} `, `{}`, `null`, ``, ` `, `{`, `}`, `[]`, `"x"`, `7`,
		`{"amount":1,"amount":2}`, `{"amount":1,"\u0061mount":2}`, `{"amount":{"a":1,"a":2}}`, `{"amount":[{"a":1},{"a":1}]}`,
		`{"amount":1} {}`, `{"amount":1}x`, `{"amount":1,"extra":true}`, `{"description":7}`, `{"amount":1,}`,
		`{"AMOUNT":"1"}`, `{"Amount":"1","amount":"2"}`, `{"amount":"1\u0000"}`, "{\"amount\":\"\x00\"}", "{\"description\":\"\xff\"}",
		`{"amount":"1","description":"\ud800"}`, `{"amount":1e3}`, `{"amount":-0}`, `{"amount":.5}`, `{"amount":00.10}`,
		`{"amount":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100),
		`{"username":"alice","password":"secret123"}`, `{"username":"alice","username":"bob","password":"x"}`,
		`{"purpose":"withdrawal"}`, `{"purpose":null}`, `{"method":"wallet"}`, `{"method":"wallet","method":"card"}`,
		"\ufeff{}", `{"amount":1}` + "\x00",
	} {
		for k := range bodyKinds {
			f.Add([]byte(s), uint8(k))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, kind uint8) {
		k := bodyKinds[int(kind)%len(bodyKinds)]
		dst := k.new()
		p := httpapi.Decode(body, dst)
		if p != nil {
			if p.Status != http.StatusBadRequest || (p.Code != "invalid_json" && p.Code != "invalid_request") || p.Detail == "" {
				t.Fatalf("Decode(%q) = %+v; want 400 invalid_json or invalid_request with a detail", body, p)
			}
			if p.Code == "invalid_request" && !json.Valid(body) {
				t.Fatalf("Decode(%q) = invalid_request for a body that is not JSON; want invalid_json", body)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("Decode(%q) accepted a body that is not one JSON value", body)
		}
		if c := bytes.TrimLeft(body, " \t\r\n"); len(c) == 0 || c[0] != '{' && !bytes.HasPrefix(c, []byte("null")) {
			t.Fatalf("Decode(%q) accepted a body that is not an object", body)
		}
		top, dup := members(body)
		if dup {
			t.Fatalf("Decode(%q) accepted a repeated member", body)
		}
		for _, name := range top {
			known := false
			for _, f := range k.fields {
				known = known || name == f
			}
			if !known && tolerateCaseFoldedMembers && foldsToAny(name, k.fields) {
				continue // the known, reported bug below
			}
			if !known {
				t.Fatalf("Decode(%q) into %T accepted the member %q; want 400 invalid_request (unknown member)", body, dst, name)
			}
		}
	})
}

// errReader fails after its data.
type errReader struct{ r io.Reader }

func (e errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, errors.New("connection reset")
	}
	return n, err
}

// FuzzReadBody: bodies up to 64 KiB are read whole and exactly, one byte
// more is 413 body_too_large, a body that fails while read is 400.
func FuzzReadBody(f *testing.F) {
	for _, n := range []uint32{0, 1, httpapi.MaxBody - 1, httpapi.MaxBody, httpapi.MaxBody + 1, 1 << 20} {
		f.Add([]byte("{}"), n, false)
		f.Add([]byte("\x00"), n, true)
	}
	f.Fuzz(func(t *testing.T, pattern []byte, n uint32, broken bool) {
		size := int(n % (httpapi.MaxBody + 4096))
		if len(pattern) == 0 {
			pattern = []byte{'x'}
		}
		body := bytes.Repeat(pattern, size/len(pattern)+1)[:size]
		var rd io.Reader = bytes.NewReader(body)
		if broken {
			rd = errReader{rd}
		}
		r := httptest.NewRequest(http.MethodPost, "/api/v1/deposits", rd)
		got, p := httpapi.ReadBody(r)
		switch {
		case broken && size <= httpapi.MaxBody:
			if p == nil || p.Status != http.StatusBadRequest || p.Code != "invalid_request" {
				t.Fatalf("%d bytes then an error: %+v; want 400 invalid_request", size, p)
			}
		case size > httpapi.MaxBody:
			if p == nil || p.Status != http.StatusRequestEntityTooLarge || p.Code != "body_too_large" {
				t.Fatalf("%d bytes: %+v; want 413 body_too_large", size, p)
			}
		default:
			if p != nil || !bytes.Equal(got, body) {
				t.Fatalf("%d bytes: %d bytes back, %+v; want the body exactly", size, len(got), p)
			}
		}
	})
}
