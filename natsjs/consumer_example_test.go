package natsjs_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/natsjs"
	"github.com/onceguard/onceguard/sqldialect"
)

// A service that credits loyalty points for onceguard's deposit events:
// each event's points are added in the transaction that records its id,
// and the message is acked after that commit, so a redelivered event
// (after a crash, a lost ack or a republish) adds nothing. The connection,
// the consumer and the database are the application's own.
func ExampleInbox_Consume() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	db, err := sql.Open("pgx", "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlstore.New(db, sqldialect.Postgres, nil)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ONCEGUARD", jetstream.ConsumerConfig{
		Durable:       "loyalty",
		FilterSubject: "onceguard.deposit.succeeded",
		AckPolicy:     jetstream.AckExplicitPolicy,
	})
	if err != nil {
		log.Fatal(err)
	}

	inbox := &natsjs.Inbox{
		Store:   store,
		Source:  "loyalty/ONCEGUARD",
		OnError: func(msg jetstream.Msg, err error) { log.Printf("loyalty: %v", err) },
	}
	err = inbox.Consume(ctx, cons, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
		var ev struct {
			UserID string `json:"user_id"`
			Data   struct {
				Amount string `json:"amount"`
			} `json:"data"`
		}
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			return err // nak'ed and redelivered; a consumer's MaxDeliver bounds it
		}
		_, err := tx.ExecContext(ctx, `UPDATE loyalty SET points = points + 1 WHERE user_id = $1`, ev.UserID)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
