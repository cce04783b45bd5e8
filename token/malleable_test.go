package token_test

import (
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/token"
)

// A signed token has exactly one spelling: its one-time use is the UNIQUE
// hash of its text (idempotency/sqlstore), so a second text that verifies
// the same would be a second use of one token. 43 base64 characters carry
// 258 bits for the 256 of the token: the last character's two spare bits
// must not be ignored.
func TestSignedOneSpelling(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tk := token.New(nothingStore{t}, &token.Options{Key: []byte(strings.Repeat("k", 32)), Now: func() time.Time { return now }})
	for range 50 {
		is, err := tk.Issue(t.Context(), "alice", "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		last := strings.IndexByte(alphabet, is.Token[len(is.Token)-1])
		for spare := 1; spare < 4; spare++ {
			alt := is.Token[:len(is.Token)-1] + string(alphabet[last^spare])
			if err := tk.Verify(alt, "alice", "withdrawal"); err == nil {
				t.Fatalf("Verify(%q) = nil, a second spelling of %q: one token, two keys", alt, is.Token)
			}
		}
	}
}
