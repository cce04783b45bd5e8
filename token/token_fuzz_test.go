package token_test

// Fuzz targets for submit tokens (st_...): how a key is recognised as a
// token, hashed and looked up, and that only the exact token, used by its
// exact subject for its exact purpose, is ever accepted.
//
//	go test -run XXX -fuzz FuzzTokenVariant -fuzztime 45s -parallel 1 ./token/

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// countingStore counts the calls that reach the store.
type countingStore struct {
	token.Store
	calls atomic.Int64
}

func (s *countingStore) GetToken(ctx context.Context, hash string) (token.Record, error) {
	s.calls.Add(1)
	return s.Store.GetToken(ctx, hash)
}

func (s *countingStore) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	s.calls.Add(1)
	return s.Store.BindToken(ctx, hash, subject, purpose, scope, now)
}

func (s *countingStore) UnbindToken(ctx context.Context, hash, scope string) error {
	s.calls.Add(1)
	return s.Store.UnbindToken(ctx, hash, scope)
}

// FuzzHash: the stored form of a token is the hex SHA-256 of its exact
// bytes, and IsToken is exactly the st_ prefix.
func FuzzHash(f *testing.F) {
	for _, s := range []string{"", "st_", "st_abc", "ST_abc", " st_abc", "st_abc ", "\"st_abc\"", "st_\x00", "st_é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sum := sha256.Sum256([]byte(s))
		if h := token.Hash(s); h != hex.EncodeToString(sum[:]) {
			t.Fatalf("Hash(%q) = %q; want hex SHA-256", s, h)
		}
		if token.IsToken(s) != strings.HasPrefix(s, "st_") {
			t.Fatalf("IsToken(%q) = %v", s, token.IsToken(s))
		}
	})
}

// FuzzTokenVariant mints a real token and fuzzes what is sent in its
// place: the token changed at one byte, cut, extended, re-cased, quoted,
// or anything else; and the subject, purpose and scope it is used with.
// Only the exact token is accepted; every refusal matches ErrInvalid and
// burns nothing; malformed tokens never reach the store.
func FuzzTokenVariant(f *testing.F) {
	for op := range uint8(10) {
		f.Add(op, uint16(3), byte('A'), "")
		f.Add(op, uint16(10), byte(0), " ")
	}
	f.Add(uint8(0), uint16(0), byte(0), "st_")
	f.Add(uint8(3), uint16(0), byte(0), strings.Repeat("x", 40))
	f.Add(uint8(8), uint16(0), byte(0), "Alice")
	f.Add(uint8(9), uint16(0), byte(0), "withdrawal ")
	cs := &countingStore{Store: &memstore.Store{}}
	tk := token.New(cs, &token.Options{TTL: time.Hour})
	ctx := context.Background()
	const alice, purpose, scopeA, scopeB = "u_alice", "withdrawal", "scope-a", "scope-b"
	f.Fuzz(func(t *testing.T, op uint8, pos uint16, b byte, extra string) {
		cs.Store = &memstore.Store{} // one token per input, and bounded memory
		is, err := tk.Issue(ctx, alice, purpose)
		if err != nil {
			t.Fatal(err)
		}
		tok := is.Token
		if !token.IsToken(tok) || len(tok) > 64 || strings.Trim(tok[3:], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Fatalf("Issue = %q; want st_ and base64url, at most 64 bytes", tok)
		}
		subject, purp := alice, purpose
		var v string
		i := int(pos) % len(tok)
		switch op % 10 {
		case 0:
			v = extra
		case 1:
			v = tok[:i] + string([]byte{b}) + tok[i+1:]
		case 2:
			v = tok[:i]
		case 3:
			v = tok + extra
		case 4:
			v = extra + tok
		case 5:
			v = strings.ToUpper(tok[:i]) + strings.ToLower(tok[i:])
		case 6:
			v = `"` + tok + `"`
		case 7:
			v = tok[:i] + string([]byte{b}) + tok[i:]
		case 8:
			v, subject = tok, extra
		case 9:
			v, purp = tok, extra
		}
		exact := v == tok && subject == alice && purp == purpose

		if (token.Hash(v) == token.Hash(tok)) != (v == tok) {
			t.Fatalf("Hash(%q) == Hash(%q) is %v", v, tok, v != tok)
		}
		before := cs.calls.Load()
		err = tk.Check(ctx, v, subject, purp, scopeA)
		if (err == nil) != exact {
			t.Fatalf("Check(%q, %q, %q) = %v; token %q for %q/%q", v, subject, purp, err, tok, alice, purpose)
		}
		if err != nil && !errors.Is(err, token.ErrInvalid) {
			t.Fatalf("Check(%q) = %v; want an error matching ErrInvalid", v, err)
		}
		if !token.IsToken(v) || len(v) > 64 {
			if !errors.Is(err, token.ErrUnknown) || cs.calls.Load() != before {
				t.Fatalf("Check(%q) = %v after %d store calls; a malformed token is ErrUnknown without asking the store", v, err, cs.calls.Load()-before)
			}
		}

		fresh, err := tk.Consume(ctx, v, subject, purp, scopeA)
		if fresh != exact || (err == nil) != exact || err != nil && !errors.Is(err, token.ErrInvalid) {
			t.Fatalf("Consume(%q, %q, %q) = %v, %v; want fresh only for the exact token, subject and purpose", v, subject, purp, fresh, err)
		}
		if !exact {
			// Refused: nothing burnt, the real token still binds.
			if fresh, err := tk.Consume(ctx, tok, alice, purpose, scopeA); !fresh || err != nil {
				t.Fatalf("after refusing %q, Consume(real token) = %v, %v; want fresh", v, fresh, err)
			}
		}
		// Bound to scopeA now. Releasing with anything but the token
		// leaves it bound; the same scope names the same request; another
		// scope is refused.
		if v != tok {
			_ = tk.Release(ctx, v, scopeA)
		}
		_ = tk.Release(ctx, tok, scopeA+extra+"x") // another scope: no effect
		if fresh, err := tk.Consume(ctx, tok, alice, purpose, scopeA); fresh || err != nil {
			t.Fatalf("reuse in its scope = %v, %v; want false, nil", fresh, err)
		}
		if _, err := tk.Consume(ctx, tok, alice, purpose, scopeB); !errors.Is(err, token.ErrUsed) {
			t.Fatalf("use in another scope = %v; want ErrUsed", err)
		}
	})
}
