package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// DoOptions configure Do. A nil *DoOptions means all defaults.
type DoOptions struct {
	// Lease protects the running fn: fn's context ends when nine tenths
	// of it have passed, leaving the rest to store the result, since after
	// it another delivery may take the key over and run fn again. Keep it
	// well above what fn takes. Default: DefaultLease, 30s.
	Lease time.Duration
	// TTL is how long the result is kept. Default: DefaultTTL, 24h.
	TTL time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// Do runs fn at most once for key in scope, for queue consumers and jobs
// that receive the same message more than once. The first call runs fn
// and stores its result; later calls with the same fingerprint return the
// stored result with replayed = true and do not run fn. A call while the
// first still runs returns ErrInProgress (redeliver later); one with a
// different fingerprint returns ErrMismatch; an empty key ErrKeyMissing
// (a message without an id would share one record with every other). If
// fn fails or panics, nothing is stored and the key is freed, so a
// redelivery runs fn again: fn's own writes must be safe to repeat (a
// unique constraint, a conditional update), exactly as with a crash. If
// fn succeeded but its result could not be stored (the lease ran out and
// another delivery took the key over: ErrLeaseLost; or the store is
// unreachable), Do returns the result and that error: fn ran, and a
// redelivery may run it again. Store errors match ErrUnavailable.
//
// fn's context carries the run as a *Call (FromContext), as a handler's
// does under Middleware: fn may store its result in its own database
// transaction (CompleteTx with the Call's ID and Lease, then
// Call.MarkCompleted), so that its effect and its record commit together;
// sqlstore.Store.DoTx does that. Call.Forget frees the key as a failure
// would, though fn returned a result.
func Do(ctx context.Context, store idemstore.Store, scope Scope, key, fingerprint string, opts *DoOptions,
	fn func(ctx context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	if key == "" {
		return nil, false, fmt.Errorf("idempotency: do: %w", ErrKeyMissing)
	}
	o := DoOptions{Lease: DefaultLease, TTL: DefaultTTL, Now: time.Now}
	if opts != nil {
		if opts.Lease > 0 {
			o.Lease = opts.Lease
		}
		if opts.TTL > 0 {
			o.TTL = opts.TTL
		}
		if opts.Now != nil {
			o.Now = opts.Now
		}
	}
	id := RecordID(scope, key)
	begun := time.Now() // the lease runs from here, however long Begin takes
	res, err := store.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: fingerprint, Lease: o.Lease, TTL: o.TTL, Now: o.Now()})
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: do: %w", err)
	}
	switch res.Outcome {
	case idemstore.Replay:
		return bytes.Clone(res.Record.Response.Body), true, nil // the store's is read-only
	case idemstore.InProgress:
		return nil, false, ErrInProgress
	case idemstore.Mismatch:
		return nil, false, ErrMismatch
	}
	detached := context.WithoutCancel(ctx)
	call := &Call{ID: id, Lease: res.Lease, Key: key, Scope: scope, Fingerprint: fingerprint, Recovered: res.Recovered, replayHeaders: &noHeaders}
	call.bind(ctx, o.Lease, begun) // fn's context ends with ErrLeaseEnding
	defer call.endCtx()
	panicked := true
	defer func() {
		if panicked {
			_ = store.Abandon(detached, id, res.Lease)
		}
	}()
	result, err = fn((*callCtx)(call))
	panicked = false
	if err != nil {
		_ = store.Abandon(detached, id, res.Lease)
		return nil, false, err
	}
	if call.has(forgotten) { // a transient result: sent, not kept
		_ = store.Abandon(detached, id, res.Lease)
		return result, false, nil
	}
	if call.has(completed) {
		return result, false, nil
	}
	if err := store.Complete(detached, id, res.Lease, idemstore.Response{Status: 200, Body: result}, o.Now()); err != nil {
		return result, false, fmt.Errorf("idempotency: do: storing the result: %w", err)
	}
	return result, false, nil
}

// noHeaders are a Do run's replay headers: a result has none.
var noHeaders []string
