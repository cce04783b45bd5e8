package outbox_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// The pattern: the state change and its event in one transaction, and a
// relay publishing what committed. (Compiled, not run: it needs your
// database and driver; internal/integration/outbox runs the same calls on
// SQLite, and the natsjs module's Publisher sends to JetStream.)
func Example() {
	var db *sql.DB // opened with your driver (pgx, go-sql-driver/mysql, modernc.org/sqlite)
	ctx := context.Background()

	box, err := outbox.New(db, sqldialect.Postgres, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil { // or outbox.Schema in your own migrations
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(box, outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		// Send m.Payload to m.Subject with m.ID as the broker's
		// deduplication key; return nil only on the broker's ack.
		return nil
	}), nil)
	if err != nil {
		log.Fatal(err)
	}
	go relay.Run(ctx)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "ord_1"); err != nil {
		log.Fatal(err)
	}
	if err := box.Write(ctx, tx, outbox.Event{ID: "evt_ord_1_paid", Subject: "shop.order.paid", Payload: []byte(`{"id":"ord_1"}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	relay.Wake()
}
