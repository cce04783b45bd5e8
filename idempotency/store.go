// Package idempotency makes a request with an Idempotency-Key run at most
// once and answer every retry with the first answer, as the IETF draft
// "The Idempotency-Key HTTP Header Field" describes.
//
// A key's record lives in a store (package memstore, sqlstore or
// redisstore; package idemstore is what a store implements). A retry of a completed key gets the stored answer; a retry while the
// first is in flight gets "in progress"; the same key with a different
// request (fingerprint) gets "mismatch". Records are scoped to
// (principal, method, path, key), so one user's key never answers another
// user's request, and stored keys are hashes.
//
// # Atomic phases
//
// A record marked completed in one transaction and money moved in another
// can disagree after a crash: money moved with no record (a retry moves it
// again) or a record with no money. A store on the same database as the
// business data (package sqlstore) therefore lets the handler complete the
// record inside its own transaction (CompleteTx), so both commit or
// neither does. Unique constraints on (user, idempotency key) in the
// business tables stay the last line of defence: they make even a retry
// after a lost record harmless.
//
// Middleware serves the HTTP contract on net/http; Guard is the same
// checks for any other transport (the framework adapters are built on
// it); Do serves queue consumers and jobs; Once serves webhook and
// callback receivers and event consumers, which must act on each event id
// once (sqlstore.Store.OnceTx does it in the transaction of the event's
// effect; package natsjs, its own module, does it for JetStream messages).
package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// Errors returned by Do and, for the last two, by stores.
var (
	// ErrInProgress: the key's first request is still running.
	ErrInProgress = errors.New("idempotency: request in progress")
	// ErrMismatch: the key was used for a different request.
	ErrMismatch = errors.New("idempotency: key reused with a different request")
	// ErrLeaseLost: the in-flight lease ran out and another request took
	// the key over, or the record is gone; this request must not complete it.
	ErrLeaseLost = idemstore.ErrLeaseLost
	// ErrUnavailable: the store could not be reached. Fail closed.
	ErrUnavailable = idemstore.ErrUnavailable
)

// Scope is what a key is scoped to: one principal's one request target.
type Scope struct {
	Principal string // the authenticated user ("" for none)
	Method    string // the HTTP method
	Path      string // the concrete path, with its parameters
}

// String returns the scope's storage form: a hash, so that no user id or
// path is stored or logged in the clear with a key.
func (s Scope) String() string {
	return digest(s.Principal, s.Method, s.Path)
}

// RecordID returns the storage id of key in scope: one hash of the
// principal, method, path and key.
func RecordID(scope Scope, key string) string {
	return digest(scope.Principal, scope.Method, scope.Path, key)
}

// digest hashes parts, each followed by a NUL (parts never hold one:
// principals, methods, paths and keys are printable), into hex.
func digest(parts ...string) string {
	var stack [512]byte
	b := stack[:0]
	for _, p := range parts {
		b = append(b, p...)
		b = append(b, 0)
	}
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}
