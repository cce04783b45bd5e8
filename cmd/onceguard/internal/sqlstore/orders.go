package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

const orderColumns = `id, order_no, user_id, idempotency_key, amount, description, status, created_at`

// orderRead is orderColumns and the id of the payment that paid the order (” if none).
const orderRead = orderColumns + `, COALESCE((SELECT p.id FROM payments p WHERE p.paid_order_id = orders.id), '')`

func scanOrder(sc interface{ Scan(...any) error }) (app.Order, error) {
	var o app.Order
	var amount, created int64
	var status string
	err := sc.Scan(&o.ID, &o.OrderNo, &o.UserID, &o.Key, &amount, &o.Description, &status, &created, &o.PaymentID)
	o.Amount, o.Status, o.CreatedAt = money.Amount(amount), app.OrderStatus(status), at(created)
	return o, err
}

// CreateOrder stores an order; a second one under the same key returns the
// first, with created false.
func (s *Store) CreateOrder(ctx context.Context, o app.Order) (got app.Order, created bool, err error) {
	defer s.timed("create_order", time.Now(), &err)
	o.Status = app.OrderCreated
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO orders (`+orderColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
		o.ID, o.OrderNo, o.UserID, o.Key, int64(o.Amount), o.Description, string(o.Status), us(o.CreatedAt))
	if duplicate(err) {
		existing, err := scanOrder(s.db.QueryRowContext(ctx, s.q(`SELECT `+orderRead+` FROM orders WHERE user_id = ? AND idempotency_key = ?`), o.UserID, o.Key))
		return existing, false, err
	}
	return o, err == nil, err
}

// OrderByID returns a user's order; another user's is app.ErrNotFound.
func (s *Store) OrderByID(ctx context.Context, userID, id string) (o app.Order, err error) {
	defer s.timed("order", time.Now(), &err)
	o, err = scanOrder(s.db.QueryRowContext(ctx, s.q(`SELECT `+orderRead+` FROM orders WHERE id = ? AND user_id = ?`), id, userID))
	if errors.Is(err, sql.ErrNoRows) {
		return app.Order{ID: id, UserID: userID}, app.ErrNotFound
	}
	return o, err
}

// Orders returns a user's orders, newest first.
func (s *Store) Orders(ctx context.Context, userID string, limit int) (out []app.Order, err error) {
	defer s.timed("orders", time.Now(), &err)
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+orderRead+` FROM orders WHERE user_id = ? ORDER BY created_at DESC, id DESC LIMIT ?`), userID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		o, err := scanOrder(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// PayOrder pays a user's order from their balance in one transaction:
// the payment row (UNIQUE(user_id, order_id, idempotency_key): the same key
// for the same order returns the first payment, created false, while the
// same key for another order is another request, as the API scopes keys by
// path; and paid_order_id, UNIQUE: a second successful payment of the
// order is app.ErrAlreadyPaid), the debit (app.ErrInsufficientFunds, nothing
// changed), the order's status, the ledger entry. Another user's order is
// app.ErrNotFound.
//
// fence is the fencing token of the caller's lock on the order (0: none);
// the order refuses an older one than it accepted (app.ErrStaleFence).
// With Events set, the order's event is written in the same transaction.
func (s *Store) PayOrder(ctx context.Context, p app.Payment, fence int64) (got app.Payment, created bool, err error) {
	defer s.timed("pay_order", time.Now(), &err)
	o, err := s.OrderByID(ctx, p.UserID, p.OrderID)
	if err != nil {
		return p, false, err
	}
	p.Amount, p.Status = o.Amount, app.Succeeded
	now := us(p.CreatedAt)
	err = s.gate.Run(ctx, s.db, func(ctx context.Context, tx *sql.Tx) error {
		if err := s.lockRow(ctx, tx, "orders", "id", p.OrderID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO payments (id, order_id, user_id, idempotency_key, amount, status, paid_order_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
			p.ID, p.OrderID, p.UserID, p.Key, int64(p.Amount), string(p.Status), p.OrderID, now); duplicate(err) {
			return errDuplicate
		} else if err != nil {
			return err
		}
		after, err := s.adjust(ctx, tx, p.UserID, -p.Amount, now)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE orders SET status = 'paid', fence = ? WHERE id = ? AND status = 'created' AND fence <= ?`), fence, p.OrderID, fence)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return app.ErrStaleFence // not 'created' any more is impossible here: paid_order_id is UNIQUE
		}
		if err := s.ledger(ctx, tx, p.UserID, app.EntryPayment, -p.Amount, after, p.ID, now); err != nil {
			return err
		}
		if s.Events != nil { // the order's event, in the transaction that paid it
			paid := o
			paid.Status, paid.PaymentID = app.OrderPaid, p.ID
			return s.Events.Paid(ctx, tx, paid, p.CreatedAt)
		}
		return nil
	})
	if errors.Is(err, errDuplicate) { // rolled back; the reads that follow need no gate
		existing := app.Payment{UserID: p.UserID, Key: p.Key}
		var amount, created int64
		var status string
		qerr := s.db.QueryRowContext(ctx, s.q(`SELECT id, order_id, amount, status, created_at FROM payments WHERE user_id = ? AND order_id = ? AND idempotency_key = ?`), p.UserID, p.OrderID, p.Key).
			Scan(&existing.ID, &existing.OrderID, &amount, &status, &created)
		switch {
		case qerr == nil:
			existing.Amount, existing.Status, existing.CreatedAt = money.Amount(amount), app.Status(status), at(created)
			return existing, false, nil
		case errors.Is(qerr, sql.ErrNoRows): // another key's payment has the order
			return p, false, app.ErrAlreadyPaid
		}
		return p, false, qerr // not known: not said to be paid
	}
	if err != nil {
		return p, false, err
	}
	if s.Events != nil {
		s.Events.Committed()
	}
	return p, true, nil
}
