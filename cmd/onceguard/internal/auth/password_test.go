package auth_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/auth"
)

func TestPassword(t *testing.T) {
	h := auth.HashPassword("correct horse")
	if !strings.HasPrefix(h, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Errorf("hash %q; want the argon2id encoding", h)
	}
	if h2 := auth.HashPassword("correct horse"); h2 == h {
		t.Error("two hashes of one password are equal; want different salts")
	}
	if err := auth.CheckPassword(h, "correct horse"); err != nil {
		t.Errorf("CheckPassword(right) = %v", err)
	}
	if err := auth.CheckPassword(h, "correct horsf"); !errors.Is(err, auth.ErrMismatch) {
		t.Errorf("CheckPassword(wrong) = %v; want ErrMismatch", err)
	}
	for _, bad := range []string{"", "plain", "$argon2i$v=19$m=1,t=1,p=1$AA$AA", "$argon2id$v=19$m=0,t=1,p=1$AA$AA",
		"$argon2id$v=19$m=99999999,t=1,p=1$AA$AA", "$argon2id$v=19$m=8,t=1,p=1$!!$AA"} {
		if err := auth.CheckPassword(bad, "x"); err == nil || errors.Is(err, auth.ErrMismatch) {
			t.Errorf("CheckPassword(%q) = %v; want a malformed-hash error", bad, err)
		}
	}
}

func TestSessionToken(t *testing.T) {
	tok, hash := auth.NewSessionToken()
	tok2, _ := auth.NewSessionToken()
	if len(tok) < 43 || tok == tok2 {
		t.Errorf("tokens %q, %q; want long and different", tok, tok2)
	}
	if hash != auth.HashToken(tok) || len(hash) != 64 || strings.Contains(hash, tok) {
		t.Errorf("hash %q of %q; want the hex SHA-256, not the token", hash, tok)
	}
}
