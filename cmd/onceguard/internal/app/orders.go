package app

import (
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/lock"
)

// MaxDescription is the most characters an order's description may have.
const MaxDescription = 200

// OrderRequest asks for an order.
type OrderRequest struct {
	UserID, Key string
	Amount      money.Amount
	Description string
}

// CheckOrder refuses an order whose amount or description breaks the rules.
func (s *Service) CheckOrder(a money.Amount, desc string) error {
	if err := s.CheckAmount(a); err != nil {
		return err
	}
	if utf8.RuneCountInString(desc) > MaxDescription {
		return Errorf(CodeInvalid, "description: at most %d characters", MaxDescription)
	}
	return nil
}

// CreateOrder stores an order; ErrKeyReused when the key made another.
func (s *Service) CreateOrder(ctx context.Context, req OrderRequest) (Order, error) {
	o, created, err := s.cfg.Store.CreateOrder(ctx, Order{ID: newID("ord_"), OrderNo: newID("ON"), UserID: req.UserID,
		Key: req.Key, Description: req.Description, Amount: req.Amount, CreatedAt: time.Now()})
	if err != nil {
		return Order{}, err
	}
	if !created && (o.Amount != req.Amount || o.Description != req.Description) {
		return Order{}, ErrKeyReused
	}
	return o, nil
}

// Orders returns a user's orders, newest first, at most limit.
func (s *Service) Orders(ctx context.Context, userID string, limit int) ([]Order, error) {
	return s.cfg.Store.Orders(ctx, userID, limit)
}

// Order returns a user's order; another user's is ErrNotFound.
func (s *Service) Order(ctx context.Context, userID, id string) (Order, error) {
	return s.cfg.Store.OrderByID(ctx, userID, id)
}

// PayRequest asks to pay an order from the balance.
type PayRequest struct {
	UserID, Key, OrderID string
}

// Pay pays an order from the balance under the order's lock, taken without waiting so that a
// payment racing another of the same order fails fast (CodePaymentInProgress); the store's
// constraints keep it paid once. Errors: ErrNotFound, ErrAlreadyPaid, ErrInsufficientFunds, CodeBusy.
func (s *Service) Pay(ctx context.Context, req PayRequest) (Payment, error) {
	var p Payment
	err := s.underLock(ctx, orderLock(req.OrderID), false, func(fence int64) (err error) {
		p, _, err = s.cfg.Store.PayOrder(ctx, Payment{ID: newID("pay_"), OrderID: req.OrderID, UserID: req.UserID, Key: req.Key, CreatedAt: time.Now()}, fence)
		return err
	})
	kind := "payment"
	switch {
	case errors.Is(err, lock.ErrNotAcquired):
		s.audit(ctx, kind, "", req.UserID, req.Key, 0, OutcomeInProgress, "")
		return Payment{}, &Error{Code: CodePaymentInProgress, Message: "another payment of this order is being processed; retry shortly", Err: err}
	case errors.Is(err, errLock), errors.Is(err, ErrStaleFence):
		s.audit(ctx, kind, "", req.UserID, req.Key, p.Amount, OutcomeBusy, "")
		return Payment{}, busy(err)
	case errors.Is(err, ErrNotFound):
		return Payment{}, ErrNotFound
	case errors.Is(err, ErrAlreadyPaid):
		s.audit(ctx, kind, "", req.UserID, req.Key, p.Amount, OutcomeAlreadyPaid, "")
		return Payment{}, ErrAlreadyPaid
	case errors.Is(err, ErrInsufficientFunds):
		s.audit(ctx, kind, "", req.UserID, req.Key, p.Amount, OutcomeInsufficientFunds, "")
		return Payment{}, &Error{Code: CodeInsufficientFunds, Message: "the balance does not cover this payment; nothing changed"}
	case err != nil:
		return Payment{}, err
	}
	s.audit(ctx, kind, p.ID, req.UserID, req.Key, p.Amount, OutcomePaid, "")
	return p, nil
}
