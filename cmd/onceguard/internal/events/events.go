// Package events is the service's events (docs/api.md, "Events
// (--events)"): the event of each deposit or withdrawal that settles and
// each order paid, written to the outbox in the transaction of that change
// (Writer, the store's sqlstore.EventWriter), and the relay that publishes
// the outbox to the NATS JetStream stream ONCEGUARD (Start).
//
// An event's id names its change (evt_<resource id>_<status>): the
// outbox's UNIQUE(id) holds one event per change, and the id is the
// message's Nats-Msg-Id, so the stream deduplicates a republish.
package events

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/outbox"
)

// Stream and Subjects are the JetStream stream the events go to.
const (
	Stream   = "ONCEGUARD"
	Subjects = "onceguard.>"
)

// Table is the outbox's table (migration 006).
const Table = "outbox"

// Event is an event as published (the message's body).
type Event struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"` // <resource>.<status>: withdrawal.succeeded, order.paid, ...
	CreatedAt string         `json:"created_at"`
	UserID    string         `json:"user_id"`
	Data      map[string]any `json:"data"` // the resource as its GET answers it
}

// Subject is the event's subject: onceguard.<type>.
func (e Event) Subject() string { return "onceguard." + e.Type }

// OfMovement is the event of m reaching its final status at at.
func OfMovement(m app.Movement, at time.Time) Event {
	return Event{ID: "evt_" + m.ID + "_" + string(m.Status), Type: string(m.Kind) + "." + string(m.Status),
		CreatedAt: at.UTC().Format(time.RFC3339), UserID: m.UserID, Data: httpapi.MovementResource(m)}
}

// OfOrder is the event of o paid at at.
func OfOrder(o app.Order, at time.Time) Event {
	return Event{ID: "evt_" + o.ID + "_" + string(o.Status), Type: "order." + string(o.Status),
		CreatedAt: at.UTC().Format(time.RFC3339), UserID: o.UserID, Data: httpapi.OrderResource(o)}
}

// Writer writes events into the outbox on the store's transactions: a
// sqlstore.EventWriter.
type Writer struct {
	Outbox *outbox.Outbox
	// Wake, if set, is called after a commit with events (the relay's
	// Wake, so that it publishes at once).
	Wake func()
}

// Settled writes the event of m's settlement.
func (w *Writer) Settled(ctx context.Context, tx *sql.Tx, m app.Movement, at time.Time) error {
	return w.write(ctx, tx, OfMovement(m, at))
}

// Paid writes the event of o's payment.
func (w *Writer) Paid(ctx context.Context, tx *sql.Tx, o app.Order, at time.Time) error {
	return w.write(ctx, tx, OfOrder(o, at))
}

// Committed wakes the relay.
func (w *Writer) Committed() {
	if w.Wake != nil {
		w.Wake()
	}
}

func (w *Writer) write(ctx context.Context, tx *sql.Tx, e Event) error {
	body, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("events: %s: %w", e.ID, err)
	}
	return w.Outbox.Write(ctx, tx, outbox.Event{ID: e.ID, Subject: e.Subject(), Payload: body})
}
