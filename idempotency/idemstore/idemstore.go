// Package idemstore is the interface between package idempotency and the
// stores that keep its key records (memstore, sqlstore, redisstore): what
// a store implements, and what it is asked and answers. Users of the
// middleware and of Do pass a store and need nothing else from here.
//
// A key's record moves through a small state machine, atomically in its
// Store:
//
//	(none) --Begin--> in flight (with a lease) --Complete--> completed
//	                      |                                   (status,
//	                      +--Abandon (5xx, error)--> (none)    headers,
//	                      +--lease expires: the next Begin     body)
//	                         takes it over (a crashed holder)
//
// Package storetest checks that a store follows it.
package idemstore

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/onceguard/onceguard/token"
)

// Errors returned by stores; package idempotency returns the same values.
var (
	// ErrLeaseLost: the in-flight lease ran out and another request took
	// the key over, or the record is gone; this request must not complete it.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrUnavailable: the store could not be reached. Fail closed.
	ErrUnavailable = errors.New("idempotency: store unavailable")
)

// State is a record's state.
type State int

// Record states.
const (
	InFlight State = iota + 1
	Completed
)

// Response is a stored answer.
type Response struct {
	Status int         // the HTTP status
	Header http.Header // only the allow-listed headers
	Body   []byte      // byte for byte as sent
}

// Record is a key's record as a Store keeps it.
type Record struct {
	ID          string    // idempotency.RecordID of scope and key
	Fingerprint string    // of the request that created it
	State       State     // in flight or completed
	Lease       string    // random id of the in-flight holder
	LeaseUntil  time.Time // in flight: when another request may take over
	ExpiresAt   time.Time // when the record may be pruned
	TokenHash   string    // the submit token bound with it, if any
	Response    *Response // completed: the answer
}

// Outcome is what Begin decided.
type Outcome int

// Begin outcomes.
const (
	Started    Outcome = iota + 1 // this request runs; it holds the lease
	Replay                        // completed: answer with Record.Response
	InProgress                    // another request holds a live lease
	Mismatch                      // the key names a different request
)

// TokenClaim asks Begin to bind a submit token atomically with creating the
// record (see package token).
type TokenClaim struct {
	Hash    string // token.Hash of the token sent
	Subject string // who sends it: it must have been issued to them
	Purpose string // the route's purpose: it must have been issued for it
	Scope   string // idempotency.Scope.String() of the request: where it gets bound
	// Signed: the token was verified by its signature (token.Options.Key)
	// and has no record of its own: the store binds it by the key's record
	// alone, refusing a second record with the same Hash (token.ErrUsed).
	// Only a SignedTokenStore is given such a claim.
	Signed bool
	// Expired: a signed token past its TTL. Only a record it created
	// before (a retry of its request) may be answered; without one the
	// store creates nothing and returns token.ErrExpired.
	Expired bool
}

// A SignedTokenStore binds signed submit tokens (TokenClaim.Signed) by the
// key's record: at most one record holds a token's hash.
type SignedTokenStore interface {
	Store
	BindsSignedTokens()
}

// BeginRequest is one attempt to start a keyed request.
type BeginRequest struct {
	ID          string        // idempotency.RecordID(scope, key)
	Fingerprint string        // the request's fingerprint
	Lease       time.Duration // how long the in-flight state is protected
	TTL         time.Duration // how long the record is kept
	Token       *TokenClaim   // bind this token when creating the record
	Now         time.Time     // the request's time, for leases and expiry
}

// BeginResult is Begin's answer.
type BeginResult struct {
	Outcome   Outcome // what the store decided
	Lease     string  // Started: the lease to Complete or Abandon with
	Recovered bool    // Started: took over a crashed holder's expired lease
	Record    *Record // Replay, InProgress, Mismatch: the existing record
}

// Store keeps key records. Every method is atomic and safe for concurrent
// use. Errors that mean the store could not answer match ErrUnavailable;
// token refusals match token.ErrInvalid.
type Store interface {
	// Begin creates an in-flight record when none is live (binding
	// r.Token in the same atomic step, or failing with the token's reason
	// and creating nothing), takes over one whose lease expired, or reports
	// the existing record. The Record returned, with its Response's
	// header and body, may be shared with the store and with other
	// callers: it is read-only.
	Begin(ctx context.Context, r BeginRequest) (BeginResult, error)
	// Complete stores resp for the record if lease still holds it, else
	// returns ErrLeaseLost. It copies what it keeps: resp's header and
	// body are the caller's, who may reuse them once Complete returns
	// (the middleware does).
	Complete(ctx context.Context, id, lease string, resp Response, now time.Time) error
	// Abandon deletes the record if lease still holds it and unbinds its
	// token, so that a retry runs again.
	Abandon(ctx context.Context, id, lease string) error
}

// WindowStore keeps the repeat-submit window: short-lived entries that turn
// away the same request sent again under a new key.
type WindowStore interface {
	// ClaimWindow records id for window, owned by owner, unless a live
	// entry of another request exists; then it returns the time that entry
	// has left. An owner is "record/attempt" (see WindowOwner), or a bare
	// record: a live entry of the same record is a success (0) and passes
	// to owner, keeping its expiry, as a retry takes a key over.
	ClaimWindow(ctx context.Context, id, owner string, window time.Duration, now time.Time) (left time.Duration, err error)
	// FreeWindow deletes id's entry if owner, attempt and all, owns it: a
	// stale attempt never frees the entry its key's successor claimed.
	FreeWindow(ctx context.Context, id, owner string) error
}

// WindowOwner returns the window owner of one attempt (its lease) at a
// key's record.
func WindowOwner(record, attempt string) string {
	return record + "/" + attempt
}

// WindowRecord returns the record part of a window owner (up to its first
// "/"): what ClaimWindow compares to tell a retry of a key from a duplicate.
func WindowRecord(owner string) string {
	if i := strings.IndexByte(owner, '/'); i >= 0 {
		return owner[:i]
	}
	return owner
}

// FullStore is a store that keeps records, tokens and windows together,
// which lets Begin bind a token atomically with creating a record.
type FullStore interface {
	Store
	WindowStore
	token.Store
}

// Notifier is a Store that can tell a waiter when a record may have
// changed (completed, abandoned, taken over), so that a request waiting
// for a key's in-flight first request (idempotency.Options.Wait) asks
// again then instead of polling. A Store without it is polled.
type Notifier interface {
	// Watch returns a channel that receives (or is closed) after the
	// record id may have changed, until stop is called or ctx ends. A
	// wake-up may be spurious; one may also be missed on a lost
	// connection, so the waiter still polls, slowly.
	Watch(ctx context.Context, id string) (changed <-chan struct{}, stop func(), err error)
}

// Start is a key's record still to be created: with
// idempotency.Options.Deferred, Begin creates no record for a key it has
// not seen; the handler creates it in the transaction that makes its
// effect (sqlstore.Store.StartTx, or composed into one statement with
// sqlstore.Store.StartCTE), so that a crash, a rollback or a refusal
// leaves neither the record nor the effect ("atomic phases").
type Start struct {
	ID          string      // idempotency.RecordID(scope, key)
	Fingerprint string      // the request's fingerprint
	Lease       string      // the lease the record is created with: the Call's
	LeaseUntil  time.Time   // the lease's end
	ExpiresAt   time.Time   // when the record is deleted
	Token       *TokenClaim // bind this token with the record (nil: none)
	// Window, if WindowID is not "", claims the repeat-submit window entry
	// WindowID for WindowOwner until WindowUntil, with the record.
	WindowID, WindowOwner string
	WindowUntil           time.Time
	Now                   time.Time // the request's time
}

// ErrKeyTaken is a Start's answer when the key has a record already (a
// retry, a concurrent duplicate, an expired record): the caller rolls back
// and reports it (idempotency.Call.Refused), and the Guard looks the
// record up as it does without Deferred.
var ErrKeyTaken = errors.New("idempotency: the key has a record")

// WindowHeldError is a Start's answer when another request holds the
// repeat-submit window entry: the caller rolls back and reports it
// (idempotency.Call.Refused), and the Guard answers 429
// duplicate_submission with Left.
type WindowHeldError struct {
	Left time.Duration // the time the entry has left, more than 0
}

func (e *WindowHeldError) Error() string {
	return "idempotency: the same request was accepted moments ago under another key"
}
