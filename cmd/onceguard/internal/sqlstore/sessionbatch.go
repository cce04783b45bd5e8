package sqlstore

import (
	"context"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

// liveItem is one request's session check, waiting for a batch of checks or in one.
type liveItem struct {
	ctx  context.Context
	hash string
	now  time.Time
	done chan error // buffered: a batch never waits for a caller that left
}

// sessionLiveBatched is SessionLive in one statement with the checks of concurrent requests
// (Store.BatchSessions).
func (s *Store) sessionLiveBatched(ctx context.Context, hash string, now time.Time) error {
	it := &liveItem{ctx: ctx, hash: hash, now: now, done: make(chan error, 1)}
	s.lives.add(it, liveKeys, s.liveMany)
	select {
	case err := <-it.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// liveKeys: a check changes nothing, so any checks share a batch.
func liveKeys(*liveItem) batchKeys { return batchKeys{} }

// liveMany runs a batch of checks and tells each its result: one alone takes SessionLive's own
// statement, more take one that looks each session up by its key.
func (s *Store) liveMany(batch []*liveItem) {
	live, deadline := liveItems(batch, func(it *liveItem) context.Context { return it.ctx },
		func(it *liveItem, err error) { it.done <- err })
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if len(live) == 1 {
		live[0].done <- s.sessionLiveOne(ctx, live[0].hash, live[0].now)
		return
	}
	start := time.Now()
	found, err := s.liveManyStatement(ctx, live)
	s.lives.ran(s.Observe, "session_live_batch", start, len(live), err)
	for i, it := range live {
		switch {
		case err != nil:
			it.done <- err
		case found[i]:
			it.done <- nil
		default:
			it.done <- app.ErrNotFound
		}
	}
}

// liveManyStatement returns which of batch's requests find their session live, each at its
// request's time, by the request's index in batch (one session checked twice, at two times, may
// be live at one and not the other). Each is looked up by its key (a lateral subquery with
// LIMIT 1 keeps the plan to one index lookup per request, whatever the table's size).
func (s *Store) liveManyStatement(ctx context.Context, batch []*liveItem) ([]bool, error) {
	hashes, nows := make([]string, len(batch)), make([]int64, len(batch))
	for i, it := range batch {
		hashes[i], nows[i] = it.hash, us(it.now)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT t.i FROM unnest($1::text[], $2::int8[]) WITH ORDINALITY AS t(h, now, i)
CROSS JOIN LATERAL (SELECT 1 FROM sessions s WHERE s.token_hash = t.h::bpchar AND s.expires_at > t.now LIMIT 1) AS live`, hashes, nows)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := make([]bool, len(batch))
	for rows.Next() {
		var i int64
		if err := rows.Scan(&i); err != nil {
			return nil, err
		}
		if i >= 1 && i <= int64(len(found)) {
			found[i-1] = true
		}
	}
	return found, rows.Err()
}
