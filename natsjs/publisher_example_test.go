package natsjs_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/natsjs"
	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// An outbox relayed to JetStream: the stream is made when missing, and
// each event lands in it once, deduplicated by its id (Nats-Msg-Id).
func ExamplePublisher() {
	var db *sql.DB // your database, opened with your driver
	ctx := context.Background()

	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(js, &natsjs.PublisherOptions{
		Stream: &jetstream.StreamConfig{Name: "SHOP", Subjects: []string{"shop.>"}}, // duplicates window: 10m
	})
	if err != nil {
		log.Fatal(err)
	}
	box, err := outbox.New(db, sqldialect.Postgres, nil)
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(box, pub, &outbox.RelayOptions{
		OnRetry: func(m outbox.Message, err error, after time.Duration) {
			log.Printf("event %s not published (%v); again in %v", m.ID, err, after)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	go relay.Run(ctx) // until ctx ends

	// In a handler: the state change and its event, one transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// ... UPDATE orders SET status = 'paid' ...
	if err := box.Write(ctx, tx, outbox.Event{ID: "evt_123", Subject: "shop.order.paid", Payload: []byte(`{"order":"ord_1"}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	relay.Wake() // publish now rather than at the next poll
}
