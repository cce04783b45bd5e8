// Package token mints one-time submit tokens: random, unguessable keys that
// a form fetches when it is shown and sends once, as its Idempotency-Key.
//
// A token is bound to a subject (the user it was minted for) and a purpose
// ("withdrawal", "order", ...), lives TTL until used, and is stored only as
// a SHA-256 hash, so a leaked store does not leak usable tokens. Its first
// use binds it, atomically, to one request scope; from then on it names that
// request and nothing else. A use that is refused (unknown, expired,
// another subject, another purpose, another scope) burns nothing.
//
// Binding is one atomic operation in the store (a mutex, a Lua script, a
// conditional UPDATE): of any number of concurrent first uses exactly one
// binds the token. Never check-then-delete in two round trips.
//
// The idempotency package binds a token in the same atomic operation that
// creates the Idempotency-Key record, when its store keeps both.
//
// Signed tokens (Options.Key) need no store at all until they are used:
// the token carries its expiry and an HMAC-SHA-256 signature of its
// subject, purpose and expiry, so minting one is a computation and
// checking one (Verify) costs no round trip. Its one-time use is the key's
// record it creates, which holds its hash under a UNIQUE index
// (idempotency/sqlstore).
package token

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"time"
)

// Prefix starts every token, so that a key can be told to be one.
const Prefix = "st_"

// Errors. Every refusal matches ErrInvalid, so a caller that does not care
// why can test one error.
var (
	// ErrInvalid matches every reason a token cannot be used here.
	ErrInvalid = errors.New("token: invalid")
	// ErrUnknown: never minted, malformed, or pruned.
	ErrUnknown = &reason{"token: unknown"}
	// ErrExpired: its TTL passed while it was unused.
	ErrExpired = &reason{"token: expired"}
	// ErrForeign: minted for another subject.
	ErrForeign = &reason{"token: minted for another subject"}
	// ErrPurpose: minted for another purpose.
	ErrPurpose = &reason{"token: minted for another purpose"}
	// ErrUsed: already bound to another request scope.
	ErrUsed = &reason{"token: already used for another request"}
)

type reason struct{ msg string }

func (e *reason) Error() string        { return e.msg }
func (e *reason) Is(target error) bool { return target == ErrInvalid }

// Record is a token as a Store keeps it.
type Record struct {
	Hash      string    // Hash of the token; the token itself is never stored
	Subject   string    // who may use it
	Purpose   string    // what it may be used for
	ExpiresAt time.Time // when it expires if unused
	Scope     string    // the request scope it is bound to; "" while unused
}

// Check returns nil if the record may be used by subject for purpose in
// scope at now, else the reason (matching ErrInvalid). Stores use it inside
// their atomic operations.
func (r Record) Check(subject, purpose, scope string, now time.Time) error {
	switch {
	case r.Subject != subject:
		return ErrForeign
	case r.Purpose != purpose:
		return ErrPurpose
	case r.Scope != "" && r.Scope != scope:
		return ErrUsed
	case r.Scope == "" && !now.Before(r.ExpiresAt):
		return ErrExpired
	}
	return nil
}

// Store keeps token records. Implementations must be safe for concurrent
// use and make BindToken atomic.
type Store interface {
	// PutToken stores a new record.
	PutToken(ctx context.Context, r Record) error
	// GetToken returns the record with hash, or ErrUnknown.
	GetToken(ctx context.Context, hash string) (Record, error)
	// BindToken binds the token to scope if Record.Check allows it at now.
	// It returns fresh = true when this call bound it, false when it was
	// already bound to scope, or the reason it may not be used.
	BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (fresh bool, err error)
	// UnbindToken makes a token bound to scope unused again (its request
	// failed in a way that must allow a retry). A token bound elsewhere is
	// left alone.
	UnbindToken(ctx context.Context, hash, scope string) error
}

// Defaults of Options and of the stores.
const (
	// DefaultTTL is how long an unused token lives unless Options.TTL says.
	DefaultTTL = 5 * time.Minute
	// BoundTTL is how long a store keeps a token that BindToken bound
	// (one bound with a key's record is kept as long as the record).
	BoundTTL = 24 * time.Hour
)

// Options configure Tokens. A nil *Options means all defaults.
type Options struct {
	// TTL is how long an unused token lives. Default: DefaultTTL, 5m.
	TTL time.Duration
	// Key, when set (at least 32 bytes, shared by every instance), makes
	// tokens signed instead of stored: Issue writes nothing, and Verify
	// checks a token's subject, purpose and expiry from its HMAC-SHA-256
	// signature alone. Its one-time use is the Idempotency-Key record it
	// creates: a store that binds signed tokens (idempotency/sqlstore)
	// refuses a second record with the same token (ErrUsed). Check,
	// Consume and Release do not apply to them. Default: nil, stored
	// tokens.
	Key []byte
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// Tokens mints and checks tokens in a Store. It is safe for concurrent use.
type Tokens struct {
	store Store
	ttl   time.Duration
	now   func() time.Time
	key   []byte    // signed tokens; nil: stored ones
	macs  sync.Pool // of *keyedMAC
}

// New returns Tokens on store.
func New(store Store, opts *Options) *Tokens {
	t := &Tokens{store: store, ttl: DefaultTTL, now: time.Now}
	if opts != nil {
		if opts.TTL > 0 {
			t.ttl = opts.TTL
		}
		if opts.Now != nil {
			t.now = opts.Now
		}
		if opts.Key != nil {
			if len(opts.Key) < 32 {
				panic("token: Options.Key must be at least 32 bytes")
			}
			t.key = append([]byte(nil), opts.Key...)
		}
	}
	return t
}

// Signed reports whether t mints signed tokens (Options.Key).
func (t *Tokens) Signed() bool { return t.key != nil }

// Issued is a freshly minted token.
type Issued struct {
	Token     string    // "st_" and 32 characters (192 random bits): give it to the client; the store keeps only its hash
	Subject   string    // who may use it
	Purpose   string    // what for
	ExpiresAt time.Time // when it stops being usable unless used
}

// Issue mints a token for subject and purpose. Both must be non-empty.
func (t *Tokens) Issue(ctx context.Context, subject, purpose string) (Issued, error) {
	if subject == "" || purpose == "" {
		return Issued{}, errors.New("token: issue: empty subject or purpose")
	}
	exp := t.now().Add(t.ttl)
	if t.key != nil {
		tok := t.sign(subject, purpose, exp)
		return Issued{Token: tok, Subject: subject, Purpose: purpose, ExpiresAt: exp.Truncate(time.Second)}, nil
	}
	var b [24]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	tok := Prefix + base64.RawURLEncoding.EncodeToString(b[:])
	if err := t.store.PutToken(ctx, Record{Hash: Hash(tok), Subject: subject, Purpose: purpose, ExpiresAt: exp}); err != nil {
		return Issued{}, fmt.Errorf("token: issue: %w", err)
	}
	return Issued{Token: tok, Subject: subject, Purpose: purpose, ExpiresAt: exp}, nil
}

// Check reports, without binding anything, whether tok may be used by
// subject for purpose in scope: nil, or an error matching ErrInvalid (and
// the specific reason), or a store error.
func (t *Tokens) Check(ctx context.Context, tok, subject, purpose, scope string) error {
	if !wellFormed(tok) {
		return ErrUnknown
	}
	r, err := t.store.GetToken(ctx, Hash(tok))
	if err != nil {
		return err
	}
	return r.Check(subject, purpose, scope, t.now())
}

// Consume binds tok to scope atomically: of concurrent callers exactly one
// gets fresh = true. Later uses in the same scope get fresh = false and no
// error (they name the same request); anywhere else they get ErrUsed.
func (t *Tokens) Consume(ctx context.Context, tok, subject, purpose, scope string) (fresh bool, err error) {
	if !wellFormed(tok) {
		return false, ErrUnknown
	}
	return t.store.BindToken(ctx, Hash(tok), subject, purpose, scope, t.now())
}

// Release makes a token bound to scope unused again.
func (t *Tokens) Release(ctx context.Context, tok, scope string) error {
	if !wellFormed(tok) {
		return ErrUnknown
	}
	return t.store.UnbindToken(ctx, Hash(tok), scope)
}

// A signed token is Prefix and 43 characters: the base64 of its expiry
// (4 bytes, Unix seconds), a nonce (9), a tag of its subject (3) and the
// signature (16) of subject, purpose and those.
const (
	signedLen = len(Prefix) + 43
	tagLen    = 3
	macLen    = 16
)

func (t *Tokens) sign(subject, purpose string, exp time.Time) string {
	var b [32]byte
	binary.BigEndian.PutUint32(b[:4], uint32(exp.Unix()))
	_, _ = rand.Read(b[4:13])
	t.tag(b[13:16], subject)
	t.mac(b[16:], subject, purpose, b[:16])
	return Prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// keyedMAC is a pooled HMAC-SHA-256 under the Tokens' key with its
// buffers: a tag or MAC costs no allocation once the pool is warm.
type keyedMAC struct {
	h   hash.Hash // Reset restores its keyed state: the key is not hashed again
	msg []byte
	sum []byte
}

// sumOf writes the first len(out) bytes of the HMAC of m.msg to out and
// gives m back to the pool.
func (t *Tokens) sumOf(m *keyedMAC, out []byte) {
	m.h.Reset()
	m.h.Write(m.msg)
	m.sum = m.h.Sum(m.sum[:0])
	copy(out, m.sum)
	if cap(m.msg) <= 1<<10 { // an odd long subject's buffer is not kept
		t.macs.Put(m)
	}
}

func (t *Tokens) keyed() *keyedMAC {
	if m, ok := t.macs.Get().(*keyedMAC); ok {
		return m
	}
	return &keyedMAC{h: hmac.New(sha256.New, t.key)}
}

// tag writes the subject's tag, tagLen bytes, to out.
func (t *Tokens) tag(out []byte, subject string) {
	m := t.keyed()
	m.msg = append(append(m.msg[:0], "onceguard token subject\x00"...), subject...)
	t.sumOf(m, out[:tagLen])
}

// mac writes the MAC of a token's payload, macLen bytes, to out.
func (t *Tokens) mac(out []byte, subject, purpose string, payload []byte) {
	m := t.keyed()
	m.msg = append(append(m.msg[:0], "onceguard token v1\x00"...), subject...)
	m.msg = append(append(append(m.msg, 0), purpose...), 0)
	m.msg = append(m.msg, payload...)
	t.sumOf(m, out[:macLen])
}

// Verify checks a signed token (Options.Key) for subject and purpose now,
// without the store: nil, ErrForeign (minted for another subject),
// ErrExpired, or ErrUnknown (malformed, forged, for another purpose, or
// t does not sign tokens). Whether it was used is its record's to say.
func (t *Tokens) Verify(tok, subject, purpose string) error {
	if t.key == nil || len(tok) != signedLen || !IsToken(tok) {
		return ErrUnknown
	}
	var b [32]byte
	// Strict: 43 characters carry 2 bits more than the token's 256, and a
	// decoder that ignored them would verify four spellings of one token,
	// four keys (records, uses) for one signature.
	if n, err := strictB64.Decode(b[:], []byte(tok[len(Prefix):])); err != nil || n != len(b) {
		return ErrUnknown
	}
	var tag [tagLen]byte
	t.tag(tag[:], subject)
	if !hmac.Equal(b[13:16], tag[:]) {
		return ErrForeign
	}
	var mac [macLen]byte
	t.mac(mac[:], subject, purpose, b[:16])
	if !hmac.Equal(b[16:], mac[:]) {
		return ErrUnknown
	}
	if !t.now().Before(time.Unix(int64(binary.BigEndian.Uint32(b[:4])), 0)) {
		return ErrExpired
	}
	return nil
}

// strictB64 decodes signed tokens: only the one spelling sign writes.
var strictB64 = base64.RawURLEncoding.Strict()

// IsToken reports whether key has the token prefix.
func IsToken(key string) bool { return strings.HasPrefix(key, Prefix) }

// Hash is the form a token is stored and looked up in: hex SHA-256. Tokens
// carry 192 random bits, so a fast hash is enough.
func Hash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

func wellFormed(tok string) bool {
	return IsToken(tok) && len(tok) <= 64
}
