package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
)

// ManyCompleter is a RecordCompleter that also completes many records in one PostgreSQL
// statement (idempotency/sqlstore.Store.CompleteManyCTE): Store.BatchSettle needs one.
type ManyCompleter interface {
	CompleteManyCTE(from string, first int) (idemsql.CTE, error)
}

// errNoManyCompleter is a batch whose Records cannot complete many records at once: its
// settlements run alone.
var errNoManyCompleter = errors.New("sqlstore: Records is not a ManyCompleter")

// settleItem is one request's settlement of a withdrawal, waiting for a batch or in one.
type settleItem struct {
	ctx     context.Context
	id      string
	outcome app.Status
	rec     *app.Record
	done    chan settleResult // buffered: a batch never waits for a caller that left
}

// settleResult is a batched settlement's result, as settleOne's; alone when the batch could
// not settle it (its statement failed, so nothing of it committed; or its withdrawal was
// settled by a statement that committed after the batch's snapshot): the caller then settles
// it on its own.
type settleResult struct {
	moved  bool
	status app.Status
	err    error
	alone  bool
}

// settleBatched is settleOne of a withdrawal, in one statement with the settlements of
// concurrent requests. Settle calls it for withdrawals that succeeded, so a batch's
// settlements share one outcome.
func (s *Store) settleBatched(ctx context.Context, id string, outcome app.Status, rec *app.Record, async bool) (bool, app.Status, error) {
	it := &settleItem{ctx: ctx, id: id, outcome: outcome, rec: rec, done: make(chan settleResult, 1)}
	s.batch.add(it, settleKeys, func(batch []*settleItem) { s.settleMany(batch, async) })
	select {
	case r := <-it.done:
		if r.alone {
			return s.settleOne(ctx, "withdrawals", id, outcome, rec, async)
		}
		return r.moved, r.status, r.err
	case <-ctx.Done():
		// Whether it committed is unknown, as when a statement's context ends.
		return false, "", ctx.Err()
	}
}

// settleKeys are what a settlement changes: its movement and its record.
func settleKeys(it *settleItem) batchKeys { return batchKeys{"m:" + it.id, "r:" + it.rec.ID} }

// settleMany settles a batch and tells each settlement its result.
func (s *Store) settleMany(batch []*settleItem, async bool) {
	live, deadline := liveItems(batch, func(it *settleItem) context.Context { return it.ctx },
		func(it *settleItem, err error) { it.done <- settleResult{err: err} })
	if len(live) == 0 {
		return
	}
	// In the movements' order, so that two statements that met the same rows would lock them
	// in one order.
	slices.SortFunc(live, func(a, b *settleItem) int { return strings.Compare(a.id, b.id) })
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	results, err := s.settleManyStatement(ctx, live, async)
	s.batch.ran(s.Observe, "settle_batch", start, len(live), err)
	for _, it := range live {
		r, ok := results[it.id]
		if err != nil || !ok {
			r = settleResult{alone: true}
		}
		it.done <- r
	}
}

// settleManyStatement settles a batch in one statement, set-wise: each withdrawal still
// pending moves to its outcome and leaves the backlog, and its key's record completes when it
// moved here or was settled the same way before (as settleOne: one settled otherwise keeps
// its record in flight, and one missing completes nothing). The statement reads the
// withdrawals in its snapshot: one pending there that it did not move was settled by a
// statement that committed since, and is settled alone, as settleOne tries again.
//
// The service's sessions plan a prepared statement once (plan_cache_mode force_generic_plan):
// planning this one at each execution costs more than running it. A plan made while the
// tables are small (a new database) scans them whole, and PostgreSQL makes it again only when
// it analyzes them (autovacuum: a minute or more later). So the statement's text names a
// generation that changes each time the batches run here double: each connection prepares it
// anew, for the tables as they are then, so a plan made on small tables lasts only until the
// batches have doubled.
func (s *Store) settleManyStatement(ctx context.Context, batch []*settleItem, async bool) (map[string]settleResult, error) {
	mc, ok := s.Records.(ManyCompleter)
	if !ok {
		return nil, errNoManyCompleter
	}
	n := len(batch)
	ids, outcomes, recIDs, leases := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	statuses, headers, bodies := make([]int32, n), make([]string, n), make([][]byte, n)
	byID := make(map[string]*settleItem, n)
	for i, it := range batch {
		status, header, body, err := idemsql.ResponseColumns(idemstore.Response{Status: it.rec.Answer.Status, Header: it.rec.Answer.Header, Body: it.rec.Answer.Body})
		if err != nil {
			return nil, err
		}
		ids[i], outcomes[i], recIDs[i], leases[i] = it.id, string(it.outcome), it.rec.ID, it.rec.Lease
		statuses[i], headers[i], bodies[i] = int32(status), header, body
		byID[it.id] = it
	}
	cte, err := mc.CompleteManyCTE("og_rows", 9)
	if err != nil {
		return nil, err
	}
	asyncCol := ""
	if async { // see AsyncSettle and settleOne
		asyncCol = `, (SELECT set_config('synchronous_commit', 'off', true))`
	}
	// inp's filter holds for every row (a batch's settlements have one outcome, see
	// settleBatched; a row of another would be left out, and settled alone): it is there for
	// the planner, which takes an equality it has no statistics for to keep 1 row in 200, so
	// that it plans for a batch of one row and finds each by its key, where without it it
	// plans for ten and may scan a small table instead.
	q := `/* plan ` + strconv.Itoa(bits.Len64(uint64(s.batch.batches.Load()))) + ` */ WITH inp AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[], $7::bytea[])
    AS t(id, outcome, rec_id, lease, status, header, body) WHERE t.outcome = $8
), mv AS (
  UPDATE withdrawals w SET status = inp.outcome FROM inp WHERE w.id = inp.id AND w.status = 'pending' RETURNING w.id
), unpend AS (
  DELETE FROM pending_movements p USING inp WHERE p.id = inp.id
), cur AS (
  SELECT inp.id, inp.outcome, inp.rec_id, w.status AS was, EXISTS (SELECT 1 FROM mv WHERE mv.id = inp.id) AS moved
  FROM inp LEFT JOIN withdrawals w ON w.id = inp.id
), og_rows AS (
  SELECT inp.rec_id AS id, inp.lease, inp.status, inp.header, inp.body FROM inp JOIN cur ON cur.id = inp.id
  WHERE cur.moved OR cur.was = cur.outcome
), ` + cte.With + `
SELECT cur.id, cur.moved, cur.was, EXISTS (SELECT 1 FROM ` + cte.Result + ` d WHERE d.id = cur.rec_id)` + asyncCol + `
FROM cur`
	args := append([]any{ids, outcomes, recIDs, leases, statuses, headers, bodies, string(batch[0].outcome)}, cte.Args...)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	results := make(map[string]settleResult, n)
	for rows.Next() {
		var (
			id, off     string
			moved, done bool
			was         sql.NullString
		)
		dest := []any{&id, &moved, &was, &done}
		if async {
			dest = append(dest, &off)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if it := byID[id]; it != nil {
			results[id] = s.batchResult(it.outcome, moved, was, done)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return results, nil
}

// batchResult is one settlement's result as settleOne would give it.
func (s *Store) batchResult(outcome app.Status, moved bool, was sql.NullString, done bool) settleResult {
	switch {
	case !was.Valid:
		return settleResult{err: app.ErrNotFound}
	case moved || app.Status(was.String) == outcome:
		var n int64
		if done {
			n = 1
		}
		r := settleResult{moved: moved, status: outcome}
		if err := s.Records.Completed(n, nil); err != nil {
			r.err = fmt.Errorf("%w: %w", app.ErrRecordLost, err)
		}
		return r
	case app.Status(was.String) == app.Pending:
		return settleResult{alone: true} // settled meanwhile: settleOne reads it again
	default:
		return settleResult{status: app.Status(was.String)} // settled otherwise
	}
}
