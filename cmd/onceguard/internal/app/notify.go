package app

import (
	"context"
	"errors"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// Notification is a payment provider's callback: its event settled the operation under Key
// (a movement's id) to Status.
type Notification struct {
	EventID string
	Key     string
	Kind    Kind // Deposit for a charge, Withdrawal for a payout
	Amount  money.Amount
	Status  Status // Succeeded or Failed
}

// NotifyMetrics counts the callbacks Notify answered, by outcome: settled, agreed (already so,
// or the event seen before), not_found or conflict.
type NotifyMetrics interface{ CountNotification(outcome string) }

// Notify settles the movement a provider's callback reports on, through the one settlement
// path the requests and the reconciler take, recording the event id in the same transaction;
// the same event again, or another agreeing with the movement's final status, changes nothing.
// Errors: ErrNotFound (no movement has the key), CodeNotifyConflict (the kind or amount is not
// the movement's, or the status contradicts its final one: nothing changes, logged at error
// level), and the store's.
func (s *Service) Notify(ctx context.Context, n Notification) error {
	m, err := s.cfg.Store.FindMovement(ctx, n.Key)
	if errors.Is(err, ErrNotFound) {
		s.countNotification("not_found")
		return err
	} else if err != nil {
		return err
	}
	if m.Kind != n.Kind || m.Amount != n.Amount {
		return s.conflict(ctx, n, m, "the callback's kind or amount is not the movement's")
	}
	switch m.Status { // settled already: nothing to write, whatever the event
	case Pending:
	case n.Status:
		s.countNotification("agreed")
		return nil
	default:
		return s.conflict(ctx, n, m, "the callback contradicts the movement's final status")
	}
	settled := m
	settled.Status = n.Status
	moved, status, err := s.settle(ctx, settled, nil, "callback", n.EventID)
	switch {
	case errors.Is(err, ErrDuplicateEvent):
		s.countNotification("agreed")
		return nil
	case err != nil:
		return err
	case status != n.Status: // settled otherwise between the read and the write
		m.Status = status
		return s.conflict(ctx, n, m, "the callback contradicts the movement's final status")
	case moved:
		s.countNotification("settled")
	default:
		s.countNotification("agreed")
	}
	return nil
}

// conflict logs and counts a callback that contradicts movement m, and is its answer.
func (s *Service) conflict(ctx context.Context, n Notification, m Movement, why string) error {
	s.countNotification("conflict")
	s.logger(ctx).Error("provider notification conflict", "event_id", n.EventID, "id", m.ID, "kind", string(m.Kind),
		"amount", m.Amount.String(), "status", string(m.Status), "notified_kind", string(n.Kind),
		"notified_amount", n.Amount.String(), "notified_status", string(n.Status), "reason", why)
	return &Error{Code: CodeNotifyConflict, Message: why + "; nothing changed"}
}

func (s *Service) countNotification(outcome string) {
	if s.cfg.NotifyMetrics != nil {
		s.cfg.NotifyMetrics.CountNotification(outcome)
	}
}
