package httpapi_test

import (
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
)

// Only a string holding NUL is refused: one holding the six characters
// \u0000 (its backslash escaped in JSON) is text like any other, a valid
// password or description; a real NUL escape still is refused.
func TestDecodeEscapedBackslashNotNUL(t *testing.T) {
	type creds struct {
		Username *string `json:"username"`
		Password *string `json:"password"`
	}
	var c creds
	if p := httpapi.Decode([]byte(`{"username":"alice","password":"pass\\u0000word"}`), &c); p != nil {
		t.Errorf(`password pass\u0000word (literal backslash): %s %s; want accepted`, p.Code, p.Detail)
	} else if *c.Password != `pass\u0000word` {
		t.Errorf("password = %q", *c.Password)
	}
	for _, b := range []string{`{"username":"a\u0000"}`, `{"username":"\\\u0000"}`} {
		if p := httpapi.Decode([]byte(b), &c); p == nil || p.Code != "invalid_request" {
			t.Errorf("%s = %v; want invalid_request (a NUL)", b, p)
		}
	}
}
