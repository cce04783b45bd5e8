// Package auth holds the reference service's credentials: passwords kept
// only as slow salted argon2id hashes, and session tokens kept only as
// SHA-256 hashes. Comparisons are constant-time.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// Argon2id parameters (OWASP's minimum for argon2id: 19 MiB, 2 passes, 1
// lane). They are stored with every hash, so they can be raised later
// without breaking old hashes.
const (
	argonTime    = 2
	argonMemory  = 19 * 1024 // KiB
	argonThreads = 1
	argonKeyLen  = 32
	saltLen      = 16
)

// ErrMismatch is returned by CheckPassword for a wrong password.
var ErrMismatch = errors.New("auth: password does not match")

// HashPassword returns an encoded argon2id hash of password:
// $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>, base64 without padding.
func HashPassword(password string) string {
	salt := make([]byte, saltLen)
	_, _ = rand.Read(salt) // never fails (Go 1.24+)
	key := argon2.IDKey([]byte(password), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		b64.EncodeToString(salt), b64.EncodeToString(key))
}

// CheckPassword reports whether password matches encoded (from
// HashPassword): nil, ErrMismatch, or an error for a malformed hash.
func CheckPassword(encoded, password string) error {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return errors.New("auth: not an argon2id hash")
	}
	var version int
	var mem, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return errors.New("auth: unsupported argon2 version")
	}
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &mem, &t, &p); err != nil || mem == 0 || t == 0 || p == 0 || mem > 1<<20 || t > 16 {
		return errors.New("auth: bad argon2 parameters")
	}
	b64 := base64.RawStdEncoding
	salt, err1 := b64.DecodeString(parts[4])
	want, err2 := b64.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(want) == 0 || len(want) > 64 {
		return errors.New("auth: bad argon2 encoding")
	}
	got := argon2.IDKey([]byte(password), salt, t, mem, p, uint32(len(want)))
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return ErrMismatch
	}
	return nil
}

// NewSessionToken returns a random session token (256 bits, base64url) and
// the hash to store for it.
func NewSessionToken() (token, hash string) {
	var b [32]byte
	_, _ = rand.Read(b[:])
	token = base64.RawURLEncoding.EncodeToString(b[:])
	return token, HashToken(token)
}

// HashToken is the stored form of a session token: hex SHA-256.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
