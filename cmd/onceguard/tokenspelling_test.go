package main

import (
	"fmt"
	"strings"
	"testing"
)

// One submit token pays out once, however its text is spelled: the last
// base64 character of a signed token has two spare bits, and each of its
// four spellings verified, named a key of its own and withdrew again.
func TestServeTokenOneSpelling(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			c := signUp(t, startServe(t, db(t)...), "speller")
			c.expect(c.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100.00"}`), 201, "")
			tok := c.submitToken("withdrawal")
			const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
			last := strings.IndexByte(alphabet, tok[len(tok)-1])
			c.expect(c.do("POST", "/api/v1/withdrawals", tok, `{"amount":"10.00"}`), 201, "")
			for spare := 1; spare < 4; spare++ {
				alt := tok[:len(tok)-1] + string(alphabet[last^spare])
				// Another amount each time: the repeat-submit window is not what must stop it.
				c.expect(c.do("POST", "/api/v1/withdrawals", alt, fmt.Sprintf(`{"amount":"%d.00"}`, 10+spare)), 400, "submit_token_invalid")
			}
			if a := c.do("GET", "/api/v1/account", "", ""); a.body["balance"] != "90.00" {
				t.Errorf("balance = %v; want 90.00 (one withdrawal of one token)", a.body["balance"])
			}
		})
	}
}
