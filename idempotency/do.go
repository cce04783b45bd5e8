package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// DoOptions configure Do. A nil *DoOptions means all defaults.
type DoOptions struct {
	// Lease protects the running fn; keep it longer than fn takes.
	// Default: 30s.
	Lease time.Duration
	// TTL is how long the result is kept. Default: 24h.
	TTL time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// Do runs fn at most once for key in scope, for queue consumers and jobs
// that receive the same message more than once. The first call runs fn
// and stores its result; later calls with the same fingerprint return the
// stored result with replayed = true and do not run fn. A call while the
// first still runs returns ErrInProgress (redeliver later); one with a
// different fingerprint returns ErrMismatch. If fn fails, nothing is
// stored and the key is freed, so a redelivery runs fn again: fn's own
// writes must be safe to repeat (a unique constraint, a conditional
// update), exactly as with a crash. Store errors match ErrUnavailable.
func Do(ctx context.Context, store Store, scope Scope, key, fingerprint string, opts *DoOptions,
	fn func(ctx context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	o := DoOptions{Lease: 30 * time.Second, TTL: 24 * time.Hour, Now: time.Now}
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
	res, err := store.Begin(ctx, BeginRequest{ID: id, Fingerprint: fingerprint, Lease: o.Lease, TTL: o.TTL, Now: o.Now()})
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: do: %w", err)
	}
	switch res.Outcome {
	case Replay:
		return bytes.Clone(res.Record.Response.Body), true, nil // the store's is read-only
	case InProgress:
		return nil, false, ErrInProgress
	case Mismatch:
		return nil, false, ErrMismatch
	}
	detached := context.WithoutCancel(ctx)
	result, err = fn(ctx)
	if err != nil {
		_ = store.Abandon(detached, id, res.Lease)
		return nil, false, err
	}
	if err := store.Complete(detached, id, res.Lease, Response{Status: 200, Body: result}, o.Now()); err != nil {
		return result, false, fmt.Errorf("idempotency: do: storing the result: %w", err)
	}
	return result, false, nil
}
