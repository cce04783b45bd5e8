package idempotency

import (
	"context"
	"fmt"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// onceMethod is the Method of the scope Once records events in: '#' is
// no HTTP token character, so no request's record under Middleware can
// share an id with an event's.
const onceMethod = "#once"

// OnceScope returns the scope that Once, and stores' transactional forms
// of it (sqlstore.Store.OnceTx), record source's event ids in. Each
// source (a provider, a stream, a queue) is its own namespace: the same
// id from two sources is two events.
func OnceScope(source string) Scope {
	return Scope{Method: onceMethod, Path: source}
}

// Once runs fn at most once for the event eventID from source, for
// webhook and callback receivers and queue consumers that receive the
// same event more than once (duplicated, late, redelivered). It is Do
// with the event id as the key and no result:
//
//   - the first delivery runs fn and records the event: ran is true;
//   - a delivery of an event already recorded does not run fn: ran is
//     false and err nil, so answer it as done (a 2xx, an ack);
//   - a delivery while another runs fn returns ErrInProgress: answer it
//     "retry later" (a 503 with Retry-After, a delayed nak), never as done,
//     since the running one may still fail;
//   - if fn fails or panics, nothing is recorded and the event is freed
//     at once, so a redelivery runs fn again; a crashed process's event is
//     freed when its lease (DoOptions.Lease) runs out;
//   - an empty source or eventID returns ErrKeyMissing.
//
// Events are remembered for DoOptions.TTL (default 24h): keep it longer
// than the sender redelivers. On a store apart from fn's effects (memstore,
// redisstore) the record and the effect are two writes: a crash between
// fn's effect and the record lets a redelivery run fn again, and if fn
// succeeded but its record could not be stored Once returns ran = true
// with that error. So fn's own writes must still be safe to repeat; where
// the effect lives in a SQL database, use sqlstore.Store.OnceTx instead,
// which records the event in fn's own transaction.
func Once(ctx context.Context, store idemstore.Store, source, eventID string, opts *DoOptions,
	fn func(ctx context.Context) error) (ran bool, err error) {
	if source == "" || eventID == "" {
		return false, fmt.Errorf("idempotency: once: %w", ErrKeyMissing)
	}
	_, replayed, err := Do(ctx, store, OnceScope(source), eventID, "", opts, func(ctx context.Context) ([]byte, error) {
		if err := fn(ctx); err != nil {
			return nil, err
		}
		ran = true
		return nil, nil
	})
	if replayed {
		return false, nil
	}
	return ran, err
}
