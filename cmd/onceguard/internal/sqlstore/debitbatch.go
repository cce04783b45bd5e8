package sqlstore

import (
	"context"
	"errors"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
)

// ManyStarter is a RecordCompleter that also creates many records in one PostgreSQL statement
// (idempotency/sqlstore.Store.StartManyCTE): Store.BatchDebit needs one.
type ManyStarter interface {
	StartManyCTE(from string, first int, now time.Time) (idemsql.CTE, error)
}

// errNoManyStarter is a batch whose Records cannot create many records at once: its debits run
// alone.
var errNoManyStarter = errors.New("sqlstore: Records is not a ManyStarter")

// debitItem is one request's withdrawal, waiting for a batch of debits or in one.
type debitItem struct {
	ctx   context.Context
	m     app.Movement
	fence int64
	chk   checks
	done  chan debitResult // buffered: a batch never waits for a caller that left
}

// debitResult is a batched debit's result: committed, or alone when the batch did not commit
// (nothing of it did): the caller then debits on its own, which tells a refusal's reason.
type debitResult struct {
	err   error
	alone bool
}

// batchable reports whether a withdrawal can be debited in a batch: a key's record to create
// with it (a signed token or none: an unsigned one is bound by a statement of its own), under
// a session to check.
func batchable(chk checks) bool {
	return chk.start != nil && chk.session != "" && (chk.start.Token == nil || chk.start.Token.Signed)
}

// withdrawBatched is withdrawOne of a withdrawal, in one statement with the debits of
// concurrent requests (Store.BatchDebit). The batch commits only when every withdrawal in it
// was debited, with its record and window; else nothing of it commits and each runs alone.
func (s *Store) withdrawBatched(ctx context.Context, m app.Movement, fence int64, chk checks) (app.Movement, bool, error) {
	it := &debitItem{ctx: ctx, m: m, fence: fence, chk: chk, done: make(chan debitResult, 1)}
	s.debits.add(it, debitKeys, s.debitMany)
	select {
	case r := <-it.done:
		if r.alone {
			return s.withdrawOne(ctx, m, fence, chk)
		}
		if r.err != nil { // as withdrawOne answers its statement's error
			return m, false, s.Records.Started(ctx, chk.start, 0, r.err)
		}
		if err := s.Records.Started(ctx, chk.start, 1, nil); err != nil {
			return m, false, err
		}
		return m, true, nil
	case <-ctx.Done():
		// Whether it committed is unknown, as when a statement's context ends.
		return m, false, ctx.Err()
	}
}

// debitKeys are what a debit changes: its user's account (the batch's statement updates each
// account once).
func debitKeys(it *debitItem) batchKeys { return batchKeys{it.m.UserID} }

// debitMany runs a batch of debits and tells each its result.
func (s *Store) debitMany(batch []*debitItem) {
	live, deadline := liveItems(batch, func(it *debitItem) context.Context { return it.ctx },
		func(it *debitItem, err error) { it.done <- debitResult{err: err} })
	if len(live) == 0 {
		return
	}
	// In the users' order, so that two statements that met the same accounts would lock them in
	// one order.
	slices.SortFunc(live, func(a, b *debitItem) int { return strings.Compare(a.m.UserID, b.m.UserID) })
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := s.debitManyStatement(ctx, live)
	s.debits.ran(s.Observe, "withdraw_batch", start, len(live), err)
	// The statement failed on the server (a refusal, a constraint, a deadlock): nothing of it
	// committed, and each runs alone. Another error (the connection lost, say) leaves whether it
	// committed unknown, as it would a withdrawal's own statement: each answers it.
	alone := err != nil && (rolledBack(err) || errors.Is(err, errNoManyStarter))
	for _, it := range live {
		if alone {
			it.done <- debitResult{alone: true}
		} else {
			it.done <- debitResult{err: err}
		}
	}
}

// rolledBack reports whether err is PostgreSQL's answer that a statement failed while it ran
// (data, a constraint, a deadlock, the statement itself: SQLSTATE classes 22, 23, 40, 42), so
// that nothing of it, run autocommitted, committed. An error of another class (the server
// shutting down, say) may come after the commit.
func rolledBack(err error) bool {
	var pg interface{ SQLState() string }
	if !errors.As(err, &pg) {
		return false
	}
	code := pg.SQLState()
	if len(code) < 2 {
		return false
	}
	switch code[:2] {
	case "22", "23", "40", "42":
		return true
	}
	return false
}

// debitManyStatement debits a batch in one statement, set-wise, as withdrawOne debits one: each
// session checked, each key's record created with its window claimed, each account debited
// (the balance covers it, the fence is not older than the account's), each withdrawal, backlog
// entry and ledger entry inserted. It fails, and commits nothing, unless every withdrawal of the
// batch did all of it. Its plan is made once per connection and renewed as the batches double,
// as settleManyStatement's.
func (s *Store) debitManyStatement(ctx context.Context, batch []*debitItem) error {
	q, args, err := s.debitManyQuery(batch)
	if err != nil {
		return err
	}
	var got int64
	if err := s.db.QueryRowContext(ctx, q, args...).Scan(&got); err != nil {
		return err
	}
	if got != int64(len(batch)) {
		return errors.New("sqlstore: a batch of debits debited " + strconv.FormatInt(got, 10) + " of " + strconv.Itoa(len(batch)))
	}
	return nil
}

// debitManyQuery returns debitManyStatement's statement for batch, and its arguments.
func (s *Store) debitManyQuery(batch []*debitItem) (string, []any, error) {
	ms, ok := s.Records.(ManyStarter)
	if !ok {
		return "", nil, errNoManyStarter
	}
	n := len(batch)
	ids, users, keys, kinds, sess := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts, created, fences := make([]int64, n), make([]int64, n), make([]int64, n)
	recIDs, fps, leases := make([]string, n), make([]string, n), make([]string, n)
	leaseUntil, expires := make([]int64, n), make([]int64, n)
	tokens, winIDs, winOwners := make([]*string, n), make([]*string, n), make([]*string, n)
	winUntil := make([]*int64, n)
	now := batch[0].chk.start.Now
	for i, it := range batch {
		st := it.chk.start
		ids[i], users[i], keys[i], kinds[i], sess[i] = it.m.ID, it.m.UserID, it.m.Key, string(app.Withdrawal), it.chk.session
		amounts[i], created[i], fences[i] = int64(it.m.Amount), us(it.m.CreatedAt), it.fence
		recIDs[i], fps[i], leases[i], leaseUntil[i], expires[i] = st.ID, st.Fingerprint, st.Lease, us(st.LeaseUntil), us(st.ExpiresAt)
		if st.Token != nil {
			tokens[i] = &st.Token.Hash
		}
		if st.WindowID != "" {
			winIDs[i], winOwners[i] = &st.WindowID, &st.WindowOwner
			u := us(st.WindowUntil)
			winUntil[i] = &u
		}
		if st.Now.Before(now) {
			now = st.Now
		}
	}
	cte, err := ms.StartManyCTE("og_start_in", 20, now)
	if err != nil {
		return "", nil, err
	}
	// inp's filter holds for every row: it makes the planner plan for a batch of one row (see
	// settleManyStatement).
	q := `/* plan ` + strconv.Itoa(bits.Len64(uint64(s.debits.batches.Load()))) + ` */ WITH inp AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::text[], $8::text[],
    $9::text[], $10::text[], $11::int8[], $12::int8[], $13::text[], $14::text[], $15::text[], $16::int8[], $17::text[])
    AS t(id, user_id, key, amount, created_at, fence, sess, rec_id, fingerprint, lease, lease_until, expires_at,
      token_hash, win_id, win_owner, win_until, kind)
  WHERE t.kind = $18
), og_start_in AS (
  SELECT inp.rec_id AS id, inp.fingerprint, inp.lease, inp.lease_until, inp.expires_at, inp.token_hash,
    inp.win_id, inp.win_owner, inp.win_until
  FROM inp WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.token_hash = inp.sess::bpchar AND s.user_id = inp.user_id AND s.expires_at > inp.created_at)
), ` + cte.With + `, acct AS (
  UPDATE accounts a SET balance = a.balance - inp.amount, version = a.version + 1, updated_at = inp.created_at,
    fence = CASE WHEN inp.fence <> 0 THEN inp.fence ELSE a.fence END
  FROM inp WHERE a.user_id = inp.user_id AND a.balance - inp.amount >= 0 AND (inp.fence = 0 OR a.fence <= inp.fence)
    AND inp.rec_id IN (SELECT id FROM ` + cte.Result + `)
  RETURNING inp.id, a.balance
), wd AS (
  INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at)
  SELECT inp.id, inp.user_id, inp.key, inp.amount, 'pending', inp.created_at FROM inp JOIN acct ON acct.id = inp.id
), pend AS (
  INSERT INTO pending_movements (id, kind, created_at) SELECT inp.id, 'withdrawal', inp.created_at FROM inp JOIN acct ON acct.id = inp.id
), led AS (
  INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at)
  SELECT inp.user_id, 'withdrawal', -inp.amount, acct.balance, inp.id, inp.created_at FROM inp JOIN acct ON acct.id = inp.id
)
SELECT CASE WHEN c.n = $19 THEN c.n ELSE CAST('onceguard_batch_refused:' || c.n AS int) END FROM (SELECT count(*) AS n FROM acct) c`
	args := append([]any{ids, users, keys, amounts, created, fences, sess, recIDs, fps, leases, leaseUntil, expires,
		tokens, winIDs, winOwners, winUntil, kinds, string(app.Withdrawal), int64(n)}, cte.Args...)
	return q, args, nil
}
