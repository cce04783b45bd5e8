package sqlstore

import (
	"context"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// The statements the pending indexes serve, for the tests of their plans.
var (
	PendingQuery      = pendingQuery
	PendingCountQuery = pendingCountQuery
)

// Migrations returns how many migrations d has.
func Migrations(d sqldialect.Dialect) int {
	ms, err := migrations(d)
	if err != nil {
		panic(err)
	}
	return len(ms)
}

// MigrationStatements returns the statements of d's migration version.
func MigrationStatements(d sqldialect.Dialect, version int) []string {
	ms, err := migrations(d)
	if err != nil {
		panic(err)
	}
	for _, m := range ms {
		if m.version == version {
			return m.stmts
		}
	}
	return nil
}

// Gate is the store's write gate (SQLite; nil elsewhere), for tests that
// hold it to make a group.
func (s *Store) Gate() *sqldb.WriteGate { return s.gate }

// HoldSettleBatches makes each batch of settlements call hold before it runs. Set it before
// the first settlement.
func (s *Store) HoldSettleBatches(hold func()) { s.batch.hold = hold }

// SettleBatches returns how many batches committed and how many settlements they carried.
func (s *Store) SettleBatches() (batches, settlements int64) {
	return s.batch.batches.Load(), s.batch.settlements.Load()
}

// SettleBatchState returns how many settlements wait for a batch, how many are in one, and
// how many runners run.
func (s *Store) SettleBatchState() (queued, inBatch, runners int) {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue), len(s.batch.inflight) / 2, s.batch.running
}

// SettleResult is a settlement's result.
type SettleResult struct {
	Moved  bool
	Status app.Status
	Err    error
}

// SettleBatch settles the withdrawals ids (succeeded, each with its record of recs) as one
// batch, then those the batch left alone on their own, as Settle does; committed says whether
// the batch committed.
func (s *Store) SettleBatch(ctx context.Context, ids []string, recs []*app.Record) (results []SettleResult, committed bool) {
	items := make([]*settleItem, len(ids))
	for i, id := range ids {
		items[i] = &settleItem{ctx: ctx, id: id, outcome: app.Succeeded, rec: recs[i], done: make(chan settleResult, 1)}
	}
	before := s.batch.batches.Load()
	s.settleMany(items, s.AsyncSettle)
	results = make([]SettleResult, len(ids))
	for i, it := range items {
		r := <-it.done
		if r.alone {
			r.moved, r.status, r.err = s.settleOne(ctx, "withdrawals", it.id, it.outcome, it.rec, s.AsyncSettle)
		}
		results[i] = SettleResult{Moved: r.moved, Status: r.status, Err: r.err}
	}
	return results, s.batch.batches.Load() > before
}
