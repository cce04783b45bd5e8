package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/internal/app"
	"github.com/onceguard/onceguard/internal/money"
)

// Withdraw records a pending withdrawal and debits the balance in one
// transaction: the row first, so that a second withdrawal under the same
// key fails on UNIQUE(user_id, idempotency_key) before touching money
// (then the first one is returned, with created false); then a debit that
// only happens if the balance covers it (ErrInsufficientFunds, nothing
// changed); then its ledger entry.
//
// fence is the fencing token of the caller's lock on the user (0: none).
// The account keeps the last fence it accepted and refuses an older one
// (ErrStaleFence): a holder whose lock ran out cannot write after the next
// holder did.
func (s *Store) Withdraw(ctx context.Context, m app.Movement, fence int64) (got app.Movement, created bool, err error) {
	defer s.timed("withdraw", time.Now(), &err)
	m.Kind, m.Status = app.Withdrawal, app.Pending
	if s.d == Postgres {
		return s.withdrawOne(ctx, m, fence)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return m, false, err
	}
	defer tx.Rollback()
	if err := s.lockRow(ctx, tx, "accounts", "user_id", m.UserID); err != nil {
		return m, false, err
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		m.ID, m.UserID, m.Key, int64(m.Amount), string(m.Status), us(m.CreatedAt)); err != nil {
		if duplicate(err) {
			_ = tx.Rollback()
			existing, ferr := s.movementByKey(ctx, app.Withdrawal, m.UserID, m.Key)
			return existing, false, ferr
		}
		return m, false, err
	}
	after, err := s.adjustFenced(ctx, tx, m.UserID, -m.Amount, fence, us(m.CreatedAt))
	if err != nil {
		return m, false, err
	}
	if err := s.ledger(ctx, tx, m.UserID, app.EntryWithdrawal, -m.Amount, after, m.ID, us(m.CreatedAt)); err != nil {
		return m, false, err
	}
	return m, true, tx.Commit()
}

// lockRow locks the row of table whose column is v, on MySQL, before a
// transaction inserts under a unique key that concurrent requests for the
// same account or order share: they then queue on that row instead of on
// the unique entry. On InnoDB, requests waiting on the unique entry of a
// transaction that rolls back (its funds were short) deadlock among
// themselves. PostgreSQL (whose waiters re-check once the holder ends) and
// SQLite (one writer at a time) need no such lock.
func (s *Store) lockRow(ctx context.Context, tx *sql.Tx, table, column, v string) error {
	if s.d != MySQL {
		return nil
	}
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+table+` WHERE `+column+` = ? FOR UPDATE`, v).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // the statements that follow say what is missing
	}
	return err
}

// withdrawOne is Withdraw on PostgreSQL: the debit, the withdrawal's row
// and its ledger entry in one statement, so one round trip and one
// implicit transaction. The row and the entry are inserted from the
// debit's result: no debit (funds short, or a newer fence), nothing
// inserted; a duplicate key fails the statement, debit included.
func (s *Store) withdrawOne(ctx context.Context, m app.Movement, fence int64) (app.Movement, bool, error) {
	set, cond, args := ``, ``, []any{m.ID, m.UserID, m.Key, int64(m.Amount), us(m.CreatedAt)}
	if fence != 0 { // record the fence, and refuse an older one
		set, cond, args = `, fence = $6`, ` AND fence <= $6`, append(args, fence)
	}
	var after int64
	err := s.db.QueryRowContext(ctx, `WITH acct AS (
  UPDATE accounts SET balance = balance - $4, version = version + 1, updated_at = $5`+set+`
  WHERE user_id = $2 AND balance - $4 >= 0`+cond+`
  RETURNING balance
), wd AS (
  INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) SELECT $1, $2, $3, $4, 'pending', $5 FROM acct
), led AS (
  INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) SELECT $2, 'withdrawal', -$4, balance, $1, $5 FROM acct
)
SELECT balance FROM acct`, args...).Scan(&after)
	switch {
	case duplicate(err):
		existing, ferr := s.movementByKey(ctx, app.Withdrawal, m.UserID, m.Key)
		return existing, false, ferr
	case errors.Is(err, sql.ErrNoRows): // nothing changed: say why
		// The key's withdrawal first, as Withdraw's INSERT would find it.
		if existing, ferr := s.movementByKey(ctx, app.Withdrawal, m.UserID, m.Key); ferr == nil {
			return existing, false, nil
		} else if !errors.Is(ferr, ErrNotFound) {
			return m, false, ferr
		}
		var last int64
		if err := s.db.QueryRowContext(ctx, `SELECT fence FROM accounts WHERE user_id = $1`, m.UserID).Scan(&last); err != nil {
			return m, false, err
		}
		if fence != 0 && last > fence {
			return m, false, ErrStaleFence
		}
		return m, false, ErrInsufficientFunds
	case err != nil:
		return m, false, err
	}
	return m, true, nil
}

// adjust changes a balance by delta, refusing to go below zero, and
// returns the balance after. The version column advances with every
// change: the resource's own fence.
func (s *Store) adjust(ctx context.Context, tx *sql.Tx, userID string, delta money.Amount, now int64) (money.Amount, error) {
	ok, after, err := s.update(ctx, tx, `UPDATE accounts SET balance = balance + ?, version = version + 1, updated_at = ? WHERE user_id = ? AND balance + ? >= 0`,
		userID, int64(delta), now, userID, int64(delta))
	if err == nil && !ok {
		err = ErrInsufficientFunds
	}
	return after, err
}

// update runs a conditional UPDATE of userID's account and reports whether
// it changed the row, and the balance after it: in the same statement
// (RETURNING) on PostgreSQL and SQLite, by reading the row back in the
// transaction on MySQL.
func (s *Store) update(ctx context.Context, tx *sql.Tx, query, userID string, args ...any) (bool, money.Amount, error) {
	var after int64
	if s.d != MySQL {
		err := tx.QueryRowContext(ctx, s.q(query+` RETURNING balance`), args...).Scan(&after)
		if errors.Is(err, sql.ErrNoRows) {
			return false, 0, nil
		}
		return err == nil, money.Amount(after), err
	}
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return false, 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, 0, err
	}
	err = tx.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE user_id = ?`, userID).Scan(&after)
	return err == nil, money.Amount(after), err
}

// adjustFenced is adjust for a writer holding a lock with fence: the
// account must not have accepted a newer fence, and records this one.
func (s *Store) adjustFenced(ctx context.Context, tx *sql.Tx, userID string, delta money.Amount, fence, now int64) (money.Amount, error) {
	if fence == 0 {
		return s.adjust(ctx, tx, userID, delta, now)
	}
	ok, after, err := s.update(ctx, tx, `UPDATE accounts SET balance = balance + ?, version = version + 1, fence = ?, updated_at = ?
WHERE user_id = ? AND balance + ? >= 0 AND fence <= ?`, userID, int64(delta), fence, now, userID, int64(delta), fence)
	if err != nil {
		return 0, err
	}
	if !ok {
		var last int64
		if err := tx.QueryRowContext(ctx, s.q(`SELECT fence FROM accounts WHERE user_id = ?`), userID).Scan(&last); err != nil {
			return 0, err
		}
		if last > fence {
			return 0, ErrStaleFence
		}
		return 0, ErrInsufficientFunds
	}
	return after, nil
}

func (s *Store) ledger(ctx context.Context, tx *sql.Tx, userID string, kind app.EntryKind, amount, after money.Amount, ref string, now int64) error {
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		userID, string(kind), int64(amount), int64(after), ref, now)
	return err
}

// CreateDeposit records a pending deposit (no money yet); a second one
// under the same key returns the first, with created false.
func (s *Store) CreateDeposit(ctx context.Context, m app.Movement) (got app.Movement, created bool, err error) {
	defer s.timed("create_deposit", time.Now(), &err)
	m.Kind, m.Status = app.Deposit, app.Pending
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO deposits (id, user_id, idempotency_key, amount, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		m.ID, m.UserID, m.Key, int64(m.Amount), string(m.Status), us(m.CreatedAt))
	if duplicate(err) {
		return s.movementByKeyCreated(ctx, app.Deposit, m.UserID, m.Key)
	}
	return m, err == nil, err
}

func (s *Store) movementByKeyCreated(ctx context.Context, k app.Kind, userID, key string) (app.Movement, bool, error) {
	existing, err := s.movementByKey(ctx, k, userID, key)
	return existing, false, err
}

// Settle moves a pending movement to outcome: a deposit's success credits
// it, a withdrawal's failure refunds it, each with its ledger entry, in one
// transaction that also completes rec, the request's Idempotency-Key
// record, when it is not nil (through Records; if that fails, nothing
// commits). A movement settled before is
// left as it is and moved is false: the status update is conditional, and
// the ledger's UNIQUE(kind, ref) would refuse a second entry anyway.
func (s *Store) Settle(ctx context.Context, kind app.Kind, id string, outcome app.Status, now time.Time, rec *app.Record) (moved bool, err error) {
	defer s.timed("settle", time.Now(), &err)
	var credit bool
	var entry app.EntryKind
	switch kind {
	case app.Deposit: // a deposit's money arrives only with its success
		credit, entry = outcome == app.Succeeded, app.EntryDeposit
	case app.Withdrawal: // a withdrawal's left at creation: only a failure brings it back
		credit, entry = outcome != app.Succeeded, app.EntryWithdrawalRefund
	}
	t, err := table(kind)
	if err != nil {
		return false, err
	}
	if rec != nil && s.Records == nil {
		return false, errors.New("sqlstore: settle: no Records to complete the key's record")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	moved, userID, amount, err := s.settleRow(ctx, tx, t, id, outcome)
	if err != nil {
		return false, err
	}
	if moved && credit {
		after, err := s.adjust(ctx, tx, userID, money.Amount(amount), us(now))
		if err != nil {
			return false, err
		}
		if err := s.ledger(ctx, tx, userID, entry, money.Amount(amount), after, id, us(now)); err != nil {
			return false, err
		}
	}
	if rec != nil {
		resp := idempotency.Response{Status: rec.Answer.Status, Header: rec.Answer.Header, Body: rec.Answer.Body}
		if err := s.Records.CompleteTx(ctx, tx, rec.ID, rec.Lease, resp); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	return moved, nil
}

// SettleDeposit is Settle of a deposit, succeeded or failed, with no record.
func (s *Store) SettleDeposit(ctx context.Context, id string, succeeded bool, now time.Time) (bool, error) {
	return s.Settle(ctx, app.Deposit, id, outcome(succeeded), now, nil)
}

// SettleWithdrawal is Settle of a withdrawal, succeeded or failed, with no record.
func (s *Store) SettleWithdrawal(ctx context.Context, id string, succeeded bool, now time.Time) (bool, error) {
	return s.Settle(ctx, app.Withdrawal, id, outcome(succeeded), now, nil)
}

func outcome(succeeded bool) app.Status {
	if succeeded {
		return app.Succeeded
	}
	return app.Failed
}

// settleRow moves the pending row id of table to status and reports
// whether it did (false: settled before), with the row's user and amount;
// ErrNotFound if there is no such row. One statement (RETURNING) on
// PostgreSQL and SQLite; on MySQL the row is read first.
func (s *Store) settleRow(ctx context.Context, tx *sql.Tx, table, id string, status app.Status) (moved bool, userID string, amount int64, err error) {
	update := `UPDATE ` + table + ` SET status = ? WHERE id = ? AND status = 'pending'`
	read := func() error {
		err := tx.QueryRowContext(ctx, s.q(`SELECT user_id, amount FROM `+table+` WHERE id = ?`), id).Scan(&userID, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		return err
	}
	if s.d != MySQL {
		err = tx.QueryRowContext(ctx, s.q(update+` RETURNING user_id, amount`), string(status), id).Scan(&userID, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			return false, "", 0, read() // settled before, or not there
		}
		return err == nil, userID, amount, err
	}
	if err := read(); err != nil {
		return false, "", 0, err
	}
	res, err := tx.ExecContext(ctx, update, string(status), id)
	if err != nil {
		return false, "", 0, err
	}
	n, err := res.RowsAffected()
	return n > 0, userID, amount, err
}

func (s *Store) movementByKey(ctx context.Context, k app.Kind, userID, key string) (app.Movement, error) {
	t, err := table(k)
	if err != nil {
		return app.Movement{}, err
	}
	m, err := scanMovement(s.db.QueryRowContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+` WHERE user_id = ? AND idempotency_key = ?`), userID, key), k)
	if errors.Is(err, sql.ErrNoRows) {
		return app.Movement{Kind: k, UserID: userID, Key: key}, ErrNotFound
	}
	return m, err
}

// Balance returns a user's balance and the sum of their ledger, which must
// be equal.
func (s *Store) Balance(ctx context.Context, userID string) (balance, ledgerSum money.Amount, err error) {
	var b, l int64
	err = s.db.QueryRowContext(ctx, s.q(`SELECT a.balance, COALESCE((SELECT SUM(amount) FROM ledger WHERE user_id = ?), 0) FROM accounts a WHERE a.user_id = ?`), userID, userID).Scan(&b, &l)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, ErrNotFound
	}
	return money.Amount(b), money.Amount(l), err
}

// Pending returns up to limit movements of kind still pending, oldest
// first: the reconciler's backlog.
func (s *Store) Pending(ctx context.Context, kind app.Kind, limit int) (out []app.Movement, err error) {
	defer s.timed("pending", time.Now(), &err)
	t, err := table(kind)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, s.q(pendingQuery(t)), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		m, err := scanMovement(rows, kind)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// pendingQuery is Pending's statement on table, with a ? for its limit: an
// index scan of the table's pending index (migration 003: on PostgreSQL and
// SQLite partial, WHERE status = 'pending', on (created_at, id); on MySQL
// (status, created_at, id)), in its order, that stops at the limit. The
// status stays a literal: a partial index serves only a query whose WHERE
// implies the index's predicate when it is planned, which a parameter (a
// generic plan, an SQLite statement prepared before binding) does not.
func pendingQuery(table string) string {
	return `SELECT id, user_id, idempotency_key, amount, status, created_at FROM ` + table +
		` WHERE status = 'pending' ORDER BY created_at, id LIMIT ?`
}

// pendingCountQuery counts the pending deposits and withdrawals from the
// pending indexes alone (see pendingQuery), not the tables, which only grow.
const pendingCountQuery = `SELECT (SELECT COUNT(*) FROM deposits WHERE status = 'pending') + (SELECT COUNT(*) FROM withdrawals WHERE status = 'pending')`

// PendingCount counts the deposits and withdrawals still pending: the
// reconciler's whole backlog, which one pass may not reach. It reads the
// pending indexes of migration 003, whose size is the backlog's, not the
// tables' (each settlement removes its row's entry).
func (s *Store) PendingCount(ctx context.Context) (n int, err error) {
	defer classify("pending_count", &err) // timed by the reconciler
	err = s.db.QueryRowContext(ctx, pendingCountQuery).Scan(&n)
	return n, err
}

// Ledger returns a user's journal, newest first, at most limit entries (all when limit <= 0).
func (s *Store) Ledger(ctx context.Context, userID string, limit int) (out []app.LedgerEntry, err error) {
	defer s.timed("ledger", time.Now(), &err)
	q, args := `SELECT id, kind, amount, balance_after, ref, created_at FROM ledger WHERE user_id = ? ORDER BY id DESC`, []any{userID}
	if limit > 0 {
		q, args = q+` LIMIT ?`, append(args, limit)
	}
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var e app.LedgerEntry
		var a, b, created int64
		var kind string
		if err := rows.Scan(&e.ID, &kind, &a, &b, &e.Ref, &created); err != nil {
			return nil, err
		}
		e.Kind, e.Amount, e.BalanceAfter, e.CreatedAt = app.EntryKind(kind), money.Amount(a), money.Amount(b), at(created)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Account returns a user's balance and currency.
func (s *Store) Account(ctx context.Context, userID string) (a app.Account, err error) {
	defer s.timed("account", time.Now(), &err)
	var b int64
	a.UserID = userID
	err = s.db.QueryRowContext(ctx, s.q(`SELECT balance, currency FROM accounts WHERE user_id = ?`), userID).Scan(&b, &a.Currency)
	if errors.Is(err, sql.ErrNoRows) {
		return app.Account{}, ErrNotFound
	}
	a.Balance = money.Amount(b)
	return a, err
}

// Movements returns a user's movements of kind, newest first.
func (s *Store) Movements(ctx context.Context, kind app.Kind, userID string, limit int) (out []app.Movement, err error) {
	defer s.timed("movements", time.Now(), &err)
	t, err := table(kind)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+
		` WHERE user_id = ? ORDER BY created_at DESC, id DESC LIMIT ?`), userID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		m, err := scanMovement(rows, kind)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// MovementByID returns a user's movement of kind; another user's is
// ErrNotFound.
func (s *Store) MovementByID(ctx context.Context, kind app.Kind, userID, id string) (m app.Movement, err error) {
	defer s.timed("movement", time.Now(), &err)
	t, err := table(kind)
	if err != nil {
		return app.Movement{}, err
	}
	m, err = scanMovement(s.db.QueryRowContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+` WHERE id = ? AND user_id = ?`), id, userID), kind)
	if errors.Is(err, sql.ErrNoRows) {
		return app.Movement{ID: id, Kind: kind, UserID: userID}, ErrNotFound
	}
	return m, err
}
