package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
)

func TestDecode(t *testing.T) {
	type req struct {
		Amount      json.RawMessage `json:"amount"`
		Description *string         `json:"description"`
	}
	for _, tc := range []struct {
		body string
		code string
	}{
		{`{"amount":"1.00"}`, ""},
		{` {"amount":1, "description":"x"} `, ""},
		{``, "invalid_json"},
		{`{`, "invalid_json"},
		{`not json`, "invalid_json"},
		{`{"amount":1,"amount":2}`, "invalid_json"},
		{`{"amount":1} {}`, "invalid_json"},
		{`{"amount":1,"extra":true}`, "invalid_request"},
		{`{"amount":1,"description":7}`, "invalid_request"},
		{`[1]`, "invalid_request"},
	} {
		var dst req
		p := httpapi.Decode([]byte(tc.body), &dst)
		got := ""
		if p != nil {
			got = p.Code
			if p.Status != http.StatusBadRequest {
				t.Errorf("Decode(%q) status %d; want 400", tc.body, p.Status)
			}
		}
		if got != tc.code {
			t.Errorf("Decode(%q) = %q; want %q", tc.body, got, tc.code)
		}
	}
}

func TestReadBody(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", httpapi.MaxBody)))
	if b, p := httpapi.ReadBody(r); p != nil || len(b) != httpapi.MaxBody {
		t.Errorf("64 KiB body = %d bytes, %v; want accepted", len(b), p)
	}
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", httpapi.MaxBody+1)))
	if _, p := httpapi.ReadBody(r); p == nil || p.Status != http.StatusRequestEntityTooLarge || p.Code != "body_too_large" {
		t.Errorf("64 KiB + 1 body = %+v; want 413 body_too_large", p)
	}
}
