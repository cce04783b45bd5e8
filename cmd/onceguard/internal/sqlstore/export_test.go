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
	return s.batch.batches.Load(), s.batch.items.Load()
}

// SettleBatchState returns how many settlements wait for a batch, how many are in one, and
// how many runners run.
func (s *Store) SettleBatchState() (queued, inBatch, runners int) {
	queued, keys, runners := s.batch.state()
	return queued, keys / 2, runners // two keys a settlement (settleKeys)
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

// HoldDebitBatches makes each batch of debits call hold before it runs. Set it before the first
// withdrawal.
func (s *Store) HoldDebitBatches(hold func()) { s.debits.hold = hold }

// DebitBatches returns how many batches of debits committed and how many debits they carried.
func (s *Store) DebitBatches() (batches, debits int64) {
	return s.debits.batches.Load(), s.debits.items.Load()
}

// DebitBatchState returns how many debits wait for a batch, how many are in one, and how many
// runners run.
func (s *Store) DebitBatchState() (queued, inBatch, runners int) {
	return s.debits.state()
}

// state returns how many requests wait for a batch, how many keys the running batches hold,
// and how many runners run.
func (b *batcher[I]) state() (queued, inflightKeys, runners int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue), len(b.inflight), b.running
}

// WithdrawResult is a withdrawal's result.
type WithdrawResult struct {
	Movement app.Movement
	Created  bool
	Err      error
}

// DebitBatch withdraws ms (each with its fence and checks) as one batch of debits, then those the
// batch left alone on their own, as Withdraw does; committed says whether the batch committed.
func (s *Store) DebitBatch(ctx context.Context, ms []app.Movement, fences []int64, chks []*app.TxChecks) (results []WithdrawResult, committed bool) {
	items := s.debitItems(ctx, ms, fences, chks)
	before := s.debits.batches.Load()
	s.debitMany(items)
	results = make([]WithdrawResult, len(ms))
	for i, it := range items {
		r := <-it.done
		var res WithdrawResult
		switch {
		case r.alone:
			res.Movement, res.Created, res.Err = s.withdrawOne(ctx, it.m, it.fence, it.chk)
			res.Err = refusal(res.Err)
		case r.err != nil:
			res.Err = r.err
		default:
			res.Err = s.Records.Started(ctx, it.chk.start, 1, nil)
			res.Movement, res.Created = it.m, res.Err == nil
		}
		results[i] = res
	}
	return results, s.debits.batches.Load() > before
}

// DebitBatchQuery returns the statement that debits ms as one batch (see DebitBatch), and its
// arguments.
func (s *Store) DebitBatchQuery(ms []app.Movement, fences []int64, chks []*app.TxChecks) (string, []any) {
	q, args, err := s.debitManyQuery(s.debitItems(context.Background(), ms, fences, chks))
	if err != nil {
		panic(err)
	}
	return q, args
}

func (s *Store) debitItems(ctx context.Context, ms []app.Movement, fences []int64, chks []*app.TxChecks) []*debitItem {
	items := make([]*debitItem, len(ms))
	for i, m := range ms {
		c, err := s.checks(chks[i])
		if err != nil {
			panic(err)
		}
		m.Kind, m.Status = app.Withdrawal, app.Pending
		items[i] = &debitItem{ctx: ctx, m: m, fence: fences[i], chk: c, done: make(chan debitResult, 1)}
	}
	return items
}

// RolledBack is rolledBack, which tells a batch of debits that failed on the server from one
// whose outcome is unknown.
var RolledBack = rolledBack

// HoldSessionBatches makes each batch of session checks call hold before it runs. Set it
// before the first check.
func (s *Store) HoldSessionBatches(hold func()) { s.lives.hold = hold }

// SessionBatches returns how many statements checked more than one session and how many
// checks they carried.
func (s *Store) SessionBatches() (batches, checks int64) {
	return s.lives.batches.Load(), s.lives.items.Load()
}

// SessionChecksQueued returns how many session checks wait for a batch.
func (s *Store) SessionChecksQueued() int {
	queued, _, _ := s.lives.state()
	return queued
}
