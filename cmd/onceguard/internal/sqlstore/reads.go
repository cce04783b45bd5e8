package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/sqldialect"
)

// Balance returns a user's balance and the sum of their ledger, which must
// be equal.
func (s *Store) Balance(ctx context.Context, userID string) (balance, ledgerSum money.Amount, err error) {
	var b, l int64
	err = s.db.QueryRowContext(ctx, s.q(`SELECT a.balance, COALESCE((SELECT SUM(amount) FROM ledger WHERE user_id = ?), 0) FROM accounts a WHERE a.user_id = ?`), userID, userID).Scan(&b, &l)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, app.ErrNotFound
	}
	return money.Amount(b), money.Amount(l), err
}

// Pending returns up to limit movements of kind still pending, oldest
// first: the reconciler's backlog.
func (s *Store) Pending(ctx context.Context, kind app.Kind, limit int) ([]app.Movement, error) {
	return s.PendingAfter(ctx, kind, app.PendingCursor{}, limit)
}

// PendingAfter is Pending starting after the movement at after (the zero cursor: the oldest).
func (s *Store) PendingAfter(ctx context.Context, kind app.Kind, after app.PendingCursor, limit int) (out []app.Movement, err error) {
	defer s.timed("pending", time.Now(), &err)
	t, err := table(kind)
	if err != nil {
		return nil, err
	}
	q, args := pendingQuery(s.d, t), []any{limit}
	if after != (app.PendingCursor{}) {
		q, args = pendingAfterQuery(s.d, t), []any{us(after.CreatedAt), us(after.CreatedAt), after.ID, limit}
	}
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
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

// pendingQuery is Pending's statement on table, which stops at the ? limit.
// On PostgreSQL it reads the backlog table (migration 008), a few rows, and
// each movement by its key; elsewhere an index scan of the pending index
// (migration 003). The status stays a literal: a partial index serves only
// a WHERE that implies its predicate when planned, which a parameter does
// not.
func pendingQuery(d sqldialect.Dialect, table string) string {
	if d == sqldialect.Postgres {
		return `SELECT m.id, m.user_id, m.idempotency_key, m.amount, m.status, m.created_at FROM pending_movements p JOIN ` + table +
			` m ON m.id = p.id WHERE p.kind = '` + kindOf(table) + `' AND m.status = 'pending' ORDER BY p.created_at, p.id LIMIT ?`
	}
	return `SELECT id, user_id, idempotency_key, amount, status, created_at FROM ` + table +
		` WHERE status = 'pending' ORDER BY created_at, id LIMIT ?`
}

// pendingAfterQuery is pendingQuery from after a cursor: created_at ?, then id ?, come first.
func pendingAfterQuery(d sqldialect.Dialect, table string) string {
	col := ``
	if d == sqldialect.Postgres {
		col = `p.`
	}
	return strings.Replace(pendingQuery(d, table), ` ORDER BY`,
		` AND (`+col+`created_at > ? OR (`+col+`created_at = ? AND `+col+`id > ?)) ORDER BY`, 1)
}

// kindOf is the backlog's kind of a movement table's rows.
func kindOf(table string) string {
	if table == "deposits" {
		return string(app.Deposit)
	}
	return string(app.Withdrawal)
}

// pendingCountQuery counts the pending deposits and withdrawals from the
// backlog table (PostgreSQL) or the pending indexes alone (see
// pendingQuery), not the tables, which only grow.
func pendingCountQuery(d sqldialect.Dialect) string {
	if d == sqldialect.Postgres {
		return `SELECT COUNT(*) FROM pending_movements`
	}
	return `SELECT (SELECT COUNT(*) FROM deposits WHERE status = 'pending') + (SELECT COUNT(*) FROM withdrawals WHERE status = 'pending')`
}

// PendingCount counts the deposits and withdrawals still pending, from the
// pending indexes, whose size is the backlog's, not the tables'.
func (s *Store) PendingCount(ctx context.Context) (n int, err error) {
	defer classify("pending_count", &err) // timed by the reconciler
	err = s.db.QueryRowContext(ctx, pendingCountQuery(s.d)).Scan(&n)
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
		return app.Account{}, app.ErrNotFound
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
// app.ErrNotFound.
func (s *Store) MovementByID(ctx context.Context, kind app.Kind, userID, id string) (m app.Movement, err error) {
	defer s.timed("movement", time.Now(), &err)
	t, err := table(kind)
	if err != nil {
		return app.Movement{}, err
	}
	m, err = scanMovement(s.db.QueryRowContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+` WHERE id = ? AND user_id = ?`), id, userID), kind)
	if errors.Is(err, sql.ErrNoRows) {
		return app.Movement{ID: id, Kind: kind, UserID: userID}, app.ErrNotFound
	}
	return m, err
}
