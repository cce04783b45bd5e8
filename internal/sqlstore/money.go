package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// Errors of the money operations.
var (
	// ErrStaleFence: the write carried a fencing token older than the last
	// one the resource accepted: its lock was lost (a pause, an expiry)
	// and a newer holder has written since. Nothing changed; retry.
	ErrStaleFence        = errors.New("sqlstore: stale fencing token")
	ErrInsufficientFunds = errors.New("sqlstore: insufficient funds")
	ErrUsernameTaken     = errors.New("sqlstore: username taken")
	ErrNotFound          = errors.New("sqlstore: not found")
)

// Store runs the service's operations, one transaction each.
type Store struct {
	db *sql.DB
	d  sqldialect.Dialect

	// Observe, if set, is told how long each operation took (op is a
	// fixed name: "withdraw", "session_user", ...). Set it before use.
	Observe func(op string, d time.Duration)
}

func (s *Store) timed(op string, start time.Time) {
	if s.Observe != nil {
		s.Observe(op, time.Since(start))
	}
}

// Open returns a Store on db (migrated with Migrate).
func Open(db *sql.DB, d sqldialect.Dialect) *Store { return &Store{db: db, d: d} }

// q rewrites ? placeholders for PostgreSQL.
func (s *Store) q(query string) string {
	if s.d != sqldialect.Postgres {
		return query
	}
	return sqldb.Rebind(query)
}

// duplicate reports a unique-constraint violation, in every dialect.
func duplicate(err error) bool {
	if err == nil {
		return false
	}
	m := err.Error()
	return strings.Contains(m, "23505") || strings.Contains(m, "Error 1062") || strings.Contains(m, "UNIQUE constraint failed") ||
		strings.Contains(m, "duplicate key")
}

// CreateUser adds a user with an empty account.
func (s *Store) CreateUser(ctx context.Context, id, username, passwordHash, currency string, now int64) error {
	defer s.timed("create_user", time.Now())
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO users (id, username, password_hash, created_at) VALUES (?, ?, ?, ?)`), id, username, passwordHash, now); err != nil {
		if duplicate(err) {
			return ErrUsernameTaken
		}
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO accounts (user_id, balance, currency, version, updated_at) VALUES (?, 0, ?, 0, ?)`), id, currency, now); err != nil {
		return err
	}
	return tx.Commit()
}

// Movement is a deposit or a withdrawal.
type Movement struct {
	ID        string
	UserID    string
	Key       string
	Amount    money.Amount
	Status    string // pending, succeeded, failed
	CreatedAt int64
}

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
func (s *Store) Withdraw(ctx context.Context, m Movement, fence int64) (got Movement, created bool, err error) {
	defer s.timed("withdraw", time.Now())
	if s.d == sqldialect.Postgres {
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
	m.Status = "pending"
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		m.ID, m.UserID, m.Key, int64(m.Amount), m.Status, m.CreatedAt); err != nil {
		if duplicate(err) {
			_ = tx.Rollback()
			existing, ferr := s.movementByKey(ctx, "withdrawals", m.UserID, m.Key)
			return existing, false, ferr
		}
		return m, false, err
	}
	after, err := s.adjustFenced(ctx, tx, m.UserID, -m.Amount, fence, m.CreatedAt)
	if err != nil {
		return m, false, err
	}
	if err := s.ledger(ctx, tx, m.UserID, "withdrawal", -m.Amount, after, m.ID, m.CreatedAt); err != nil {
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
	if s.d != sqldialect.MySQL {
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
func (s *Store) withdrawOne(ctx context.Context, m Movement, fence int64) (Movement, bool, error) {
	m.Status = "pending"
	set, cond, args := ``, ``, []any{m.ID, m.UserID, m.Key, int64(m.Amount), m.CreatedAt}
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
		existing, ferr := s.movementByKey(ctx, "withdrawals", m.UserID, m.Key)
		return existing, false, ferr
	case errors.Is(err, sql.ErrNoRows): // nothing changed: say why
		// The key's withdrawal first, as Withdraw's INSERT would find it.
		if existing, ferr := s.movementByKey(ctx, "withdrawals", m.UserID, m.Key); ferr == nil {
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
	if s.d != sqldialect.MySQL {
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

func (s *Store) ledger(ctx context.Context, tx *sql.Tx, userID, kind string, amount, after money.Amount, ref string, now int64) error {
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		userID, kind, int64(amount), int64(after), ref, now)
	return err
}

// CreateDeposit records a pending deposit (no money yet); a second one
// under the same key returns the first, with created false.
func (s *Store) CreateDeposit(ctx context.Context, m Movement) (Movement, bool, error) {
	defer s.timed("create_deposit", time.Now())
	m.Status = "pending"
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO deposits (id, user_id, idempotency_key, amount, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		m.ID, m.UserID, m.Key, int64(m.Amount), m.Status, m.CreatedAt)
	if duplicate(err) {
		existing, ferr := s.movementByKey(ctx, "deposits", m.UserID, m.Key)
		return existing, false, ferr
	}
	return m, err == nil, err
}

// SettleDeposit marks a pending deposit succeeded and credits it, or marks
// it failed; a deposit already settled is left as it is (settling twice
// never credits twice: the status update is conditional, and the ledger's
// UNIQUE(kind, ref) would refuse a second entry anyway). Each of also
// commits with it or not at all (say, completing the request's
// Idempotency-Key record; see Also). moved reports whether this call
// settled it (false: it was settled before).
func (s *Store) SettleDeposit(ctx context.Context, id string, succeeded bool, now int64, also ...Also) (moved bool, err error) {
	// A deposit's money arrives only with its success.
	return s.settle(ctx, "deposits", id, succeeded, succeeded, "deposit", now, also)
}

// SettleWithdrawal marks a pending withdrawal succeeded, or failed and
// refunded (in the same transaction, with its ledger entry); a settled one
// is left as it is. also and moved: as for SettleDeposit.
func (s *Store) SettleWithdrawal(ctx context.Context, id string, succeeded bool, now int64, also ...Also) (moved bool, err error) {
	// A withdrawal's money left at creation: only a failure brings it back.
	return s.settle(ctx, "withdrawals", id, succeeded, !succeeded, "withdrawal_refund", now, also)
}

// Also is work that commits with a settlement, or not at all. Tx runs it
// in the settlement's transaction, last, and returns an error to roll
// everything back. Stmt and Args, when Stmt is set, are the same work as
// one UPDATE with ? placeholders, ending with its WHERE clause, that
// changes a row when it may commit and none when it may not (Tx would then
// fail): on PostgreSQL a settlement
// that credits nothing (a withdrawal's success, a deposit's failure) runs
// it inside its own statement, one round trip instead of four (BEGIN, the
// settlement, Tx, COMMIT); ErrAlsoRefused when it changed no row.
type Also struct {
	Tx   func(*sql.Tx) error
	Stmt string
	Args []any
}

// ErrAlsoRefused: an Also's statement changed no row, so nothing was
// settled.
var ErrAlsoRefused = errors.New("sqlstore: the work to commit with the settlement was refused")

// settle moves a pending row of table to its final status and, when
// credit is set, credits its amount with a ledger entry of kind, all in one
// transaction. Only the call that moves the row from pending credits, and
// only its moved is true.
func (s *Store) settle(ctx context.Context, table, id string, succeeded, credit bool, kind string, now int64, also []Also) (bool, error) {
	defer s.timed("settle", time.Now())
	status := "failed"
	if succeeded {
		status = "succeeded"
	}
	if s.d == sqldialect.Postgres && !credit && len(also) == 1 && also[0].Stmt != "" {
		return s.settleStmt(ctx, table, id, status, also[0])
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	moved, userID, amount, err := s.settleRow(ctx, tx, table, id, status)
	if err != nil {
		return false, err
	}
	if moved && credit {
		after, err := s.adjust(ctx, tx, userID, money.Amount(amount), now)
		if err != nil {
			return false, err
		}
		if err := s.ledger(ctx, tx, userID, kind, money.Amount(amount), after, id, now); err != nil {
			return false, err
		}
	}
	for _, a := range also {
		if err := a.Tx(tx); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	return moved, nil
}

// settleStmt is settle without a credit on PostgreSQL, with also's
// statement, in one statement: its data-modifying CTEs run also's UPDATE
// if the row exists, then the settlement only if that changed a row, and
// commit together. The last column reads the snapshot before the
// statement, so that a row settled before (not moved) is told from one
// that is not there.
func (s *Store) settleStmt(ctx context.Context, table, id, status string, also Also) (bool, error) {
	query := `WITH a AS (` + also.Stmt + ` AND EXISTS (SELECT 1 FROM ` + table + ` WHERE id = ?) RETURNING 1),
m AS (UPDATE ` + table + ` SET status = ? WHERE id = ? AND status = 'pending' AND EXISTS (SELECT 1 FROM a) RETURNING 1)
SELECT EXISTS (SELECT 1 FROM a), EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM ` + table + ` WHERE id = ?)`
	args := append(append(make([]any, 0, len(also.Args)+4), also.Args...), id, status, id, id)
	var done, moved, found bool
	if err := s.db.QueryRowContext(ctx, s.q(query), args...).Scan(&done, &moved, &found); err != nil {
		return false, err
	}
	switch {
	case !found:
		return false, ErrNotFound
	case !done:
		return false, ErrAlsoRefused
	}
	return moved, nil
}

// settleRow moves the pending row id of table to status and reports
// whether it did (false: settled before), with the row's user and amount;
// ErrNotFound if there is no such row. One statement (RETURNING) on
// PostgreSQL and SQLite; on MySQL the row is read first.
func (s *Store) settleRow(ctx context.Context, tx *sql.Tx, table, id, status string) (moved bool, userID string, amount int64, err error) {
	update := `UPDATE ` + table + ` SET status = ? WHERE id = ? AND status = 'pending'`
	read := func() error {
		err := tx.QueryRowContext(ctx, s.q(`SELECT user_id, amount FROM `+table+` WHERE id = ?`), id).Scan(&userID, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		return err
	}
	if s.d != sqldialect.MySQL {
		err = tx.QueryRowContext(ctx, s.q(update+` RETURNING user_id, amount`), status, id).Scan(&userID, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			return false, "", 0, read() // settled before, or not there
		}
		return err == nil, userID, amount, err
	}
	if err := read(); err != nil {
		return false, "", 0, err
	}
	res, err := tx.ExecContext(ctx, update, status, id)
	if err != nil {
		return false, "", 0, err
	}
	n, err := res.RowsAffected()
	return n > 0, userID, amount, err
}

func (s *Store) movementByKey(ctx context.Context, table, userID, key string) (Movement, error) {
	m := Movement{UserID: userID, Key: key}
	var amount int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, amount, status, created_at FROM `+table+` WHERE user_id = ? AND idempotency_key = ?`), userID, key).
		Scan(&m.ID, &amount, &m.Status, &m.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return m, ErrNotFound
	}
	m.Amount = money.Amount(amount)
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

// Pending returns up to limit movements of table ("deposits" or
// "withdrawals") still pending, oldest first: the reconciler's backlog.
func (s *Store) Pending(ctx context.Context, table string, limit int) ([]Movement, error) {
	defer s.timed("pending", time.Now())
	if table != "deposits" && table != "withdrawals" {
		return nil, fmt.Errorf("sqlstore: no movements in %q", table)
	}
	rows, err := s.db.QueryContext(ctx, s.q(pendingQuery(table)), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Movement
	for rows.Next() {
		var m Movement
		var amount int64
		if err := rows.Scan(&m.ID, &m.UserID, &m.Key, &amount, &m.Status, &m.CreatedAt); err != nil {
			return nil, err
		}
		m.Amount = money.Amount(amount)
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

// PendingCount counts the deposits and withdrawals still pending in db, a
// database this package migrated: the reconciler's whole backlog, which
// one pass (Pending's limit) may not reach. It reads the pending indexes
// of migration 003, whose size is the backlog's, not the tables'.
func PendingCount(ctx context.Context, db *sql.DB) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, pendingCountQuery).Scan(&n)
	return n, err
}

// LedgerEntry is one line of a user's journal.
type LedgerEntry struct {
	ID           int64
	Kind         string
	Amount       money.Amount
	BalanceAfter money.Amount
	Ref          string
	CreatedAt    int64
}

// Ledger returns a user's journal, newest first, at most limit entries (all when limit <= 0).
func (s *Store) Ledger(ctx context.Context, userID string, limit int) ([]LedgerEntry, error) {
	defer s.timed("ledger", time.Now())
	q, args := `SELECT id, kind, amount, balance_after, ref, created_at FROM ledger WHERE user_id = ? ORDER BY id DESC`, []any{userID}
	if limit > 0 {
		q, args = q+` LIMIT ?`, append(args, limit)
	}
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []LedgerEntry
	for rows.Next() {
		var e LedgerEntry
		var a, b int64
		if err := rows.Scan(&e.ID, &e.Kind, &a, &b, &e.Ref, &e.CreatedAt); err != nil {
			return nil, err
		}
		e.Amount, e.BalanceAfter = money.Amount(a), money.Amount(b)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Account returns a user's balance and currency.
func (s *Store) Account(ctx context.Context, userID string) (balance money.Amount, currency string, err error) {
	defer s.timed("account", time.Now())
	var b int64
	err = s.db.QueryRowContext(ctx, s.q(`SELECT balance, currency FROM accounts WHERE user_id = ?`), userID).Scan(&b, &currency)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", ErrNotFound
	}
	return money.Amount(b), currency, err
}

// ErrAlreadyPaid: the order has a successful payment already.
var ErrAlreadyPaid = errors.New("sqlstore: order already paid")

// Order is an order as stored.
type Order struct {
	ID, OrderNo, UserID, Key, Description, Status string
	Amount                                        money.Amount
	CreatedAt                                     int64
}

// CreateOrder stores an order; a second one under the same key returns the
// first, with created false.
func (s *Store) CreateOrder(ctx context.Context, o Order) (Order, bool, error) {
	defer s.timed("create_order", time.Now())
	o.Status = "created"
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO orders (id, order_no, user_id, idempotency_key, amount, description, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
		o.ID, o.OrderNo, o.UserID, o.Key, int64(o.Amount), o.Description, o.Status, o.CreatedAt)
	if duplicate(err) {
		var existing Order
		row := s.db.QueryRowContext(ctx, s.q(`SELECT id FROM orders WHERE user_id = ? AND idempotency_key = ?`), o.UserID, o.Key)
		if err := row.Scan(&existing.ID); err != nil {
			return o, false, err
		}
		existing, err = s.OrderByID(ctx, o.UserID, existing.ID)
		return existing, false, err
	}
	return o, err == nil, err
}

// OrderByID returns a user's order; another user's is ErrNotFound.
func (s *Store) OrderByID(ctx context.Context, userID, id string) (Order, error) {
	defer s.timed("order", time.Now())
	o := Order{ID: id, UserID: userID}
	var amount int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT order_no, idempotency_key, amount, description, status, created_at FROM orders WHERE id = ? AND user_id = ?`), id, userID).
		Scan(&o.OrderNo, &o.Key, &amount, &o.Description, &o.Status, &o.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return o, ErrNotFound
	}
	o.Amount = money.Amount(amount)
	return o, err
}

// Orders returns a user's orders, newest first.
func (s *Store) Orders(ctx context.Context, userID string, limit int) ([]Order, error) {
	defer s.timed("orders", time.Now())
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, order_no, idempotency_key, amount, description, status, created_at FROM orders WHERE user_id = ? ORDER BY created_at DESC, id DESC LIMIT ?`), userID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Order
	for rows.Next() {
		o := Order{UserID: userID}
		var amount int64
		if err := rows.Scan(&o.ID, &o.OrderNo, &o.Key, &amount, &o.Description, &o.Status, &o.CreatedAt); err != nil {
			return nil, err
		}
		o.Amount = money.Amount(amount)
		out = append(out, o)
	}
	return out, rows.Err()
}

// Payment is a payment of an order.
type Payment struct {
	ID, OrderID, UserID, Key, Status string
	Amount                           money.Amount
	CreatedAt                        int64
}

// PayOrder pays a user's order from their balance in one transaction:
// the payment row (UNIQUE(user_id, order_id, idempotency_key): the same key
// for the same order returns the first payment, created false, while the
// same key for another order is another request, as the API scopes keys by
// path; and paid_order_id, UNIQUE: a second successful payment of the
// order is ErrAlreadyPaid), the debit
// (ErrInsufficientFunds, nothing changed), the order's status, the ledger
// entry. Another user's order is ErrNotFound.
//
// fence is the fencing token of the caller's lock on the order (0: none);
// the order refuses an older one than it accepted (ErrStaleFence).
func (s *Store) PayOrder(ctx context.Context, p Payment, fence int64) (Payment, bool, error) {
	defer s.timed("pay_order", time.Now())
	o, err := s.OrderByID(ctx, p.UserID, p.OrderID)
	if err != nil {
		return p, false, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return p, false, err
	}
	defer tx.Rollback()
	if err := s.lockRow(ctx, tx, "orders", "id", p.OrderID); err != nil {
		return p, false, err
	}
	p.Amount, p.Status = o.Amount, "succeeded"
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO payments (id, order_id, user_id, idempotency_key, amount, status, paid_order_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
		p.ID, p.OrderID, p.UserID, p.Key, int64(p.Amount), p.Status, p.OrderID, p.CreatedAt); err != nil {
		if !duplicate(err) {
			return p, false, err
		}
		_ = tx.Rollback()
		var existing Payment
		var amount int64
		qerr := s.db.QueryRowContext(ctx, s.q(`SELECT id, order_id, amount, status, created_at FROM payments WHERE user_id = ? AND order_id = ? AND idempotency_key = ?`), p.UserID, p.OrderID, p.Key).
			Scan(&existing.ID, &existing.OrderID, &amount, &existing.Status, &existing.CreatedAt)
		switch {
		case qerr == nil:
			existing.UserID, existing.Key, existing.Amount = p.UserID, p.Key, money.Amount(amount)
			return existing, false, nil
		case errors.Is(qerr, sql.ErrNoRows): // another key's payment has the order
			return p, false, ErrAlreadyPaid
		}
		return p, false, qerr // not known: not said to be paid
	}
	after, err := s.adjust(ctx, tx, p.UserID, -p.Amount, p.CreatedAt)
	if err != nil {
		return p, false, err
	}
	res, err := tx.ExecContext(ctx, s.q(`UPDATE orders SET status = 'paid', fence = ? WHERE id = ? AND status = 'created' AND fence <= ?`), fence, p.OrderID, fence)
	if err != nil {
		return p, false, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return p, false, err
	} else if n == 0 {
		return p, false, ErrStaleFence // not 'created' any more is impossible here: paid_order_id is UNIQUE
	}
	if err := s.ledger(ctx, tx, p.UserID, "payment", -p.Amount, after, p.ID, p.CreatedAt); err != nil {
		return p, false, err
	}
	return p, true, tx.Commit()
}

// Movements returns a user's deposits or withdrawals, newest first.
func (s *Store) Movements(ctx context.Context, table, userID string, limit int) ([]Movement, error) {
	defer s.timed("movements", time.Now())
	if table != "deposits" && table != "withdrawals" {
		return nil, fmt.Errorf("sqlstore: no movements in %q", table)
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, idempotency_key, amount, status, created_at FROM `+table+
		` WHERE user_id = ? ORDER BY created_at DESC, id DESC LIMIT ?`), userID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Movement
	for rows.Next() {
		m := Movement{UserID: userID}
		var amount int64
		if err := rows.Scan(&m.ID, &m.Key, &amount, &m.Status, &m.CreatedAt); err != nil {
			return nil, err
		}
		m.Amount = money.Amount(amount)
		out = append(out, m)
	}
	return out, rows.Err()
}

// MovementByID returns a user's deposit or withdrawal; another user's is
// ErrNotFound.
func (s *Store) MovementByID(ctx context.Context, table, userID, id string) (Movement, error) {
	defer s.timed("movement", time.Now())
	if table != "deposits" && table != "withdrawals" {
		return Movement{}, fmt.Errorf("sqlstore: no movements in %q", table)
	}
	m := Movement{ID: id, UserID: userID}
	var amount int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT idempotency_key, amount, status, created_at FROM `+table+` WHERE id = ? AND user_id = ?`), id, userID).
		Scan(&m.Key, &amount, &m.Status, &m.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return m, ErrNotFound
	}
	m.Amount = money.Amount(amount)
	return m, err
}
