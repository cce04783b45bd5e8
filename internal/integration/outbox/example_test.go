package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// An event written in the transaction of the change it reports, then
// published by a relay (here a SQLite file and a publisher that prints;
// PostgreSQL, MySQL and the natsjs module's JetStream publisher take the
// same calls). A rolled-back transaction publishes nothing.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	defer db.Close()
	ctx := context.Background()

	box, err := outbox.New(db, sqldialect.SQLite, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := box.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	_, _ = db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT)`)

	// The state change and its event, in one transaction.
	tx, _ := db.BeginTx(ctx, nil)
	_, _ = tx.Exec(`INSERT INTO orders VALUES ('ord_1', 'paid')`)
	_ = box.Write(ctx, tx, outbox.Event{ID: "evt_1", Subject: "shop.order.paid", Payload: []byte(`{"order":"ord_1"}`)})
	_ = tx.Commit()

	// Rolled back: neither the order nor its event.
	tx, _ = db.BeginTx(ctx, nil)
	_, _ = tx.Exec(`INSERT INTO orders VALUES ('ord_2', 'paid')`)
	_ = box.Write(ctx, tx, outbox.Event{ID: "evt_2", Subject: "shop.order.paid", Payload: []byte(`{"order":"ord_2"}`)})
	_ = tx.Rollback()

	s, _ := box.Stats(ctx)
	fmt.Println("pending:", s.Pending)

	relay, _ := outbox.NewRelay(box, outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		fmt.Printf("publish %s to %s: %s\n", m.ID, m.Subject, m.Payload)
		return nil // the broker's ack; an error retries it, with the same id, after a backoff
	}), nil)
	n, err := relay.RunOnce(ctx) // a service runs relay.Run(ctx) in a goroutine instead
	fmt.Println("published:", n, err)
	s, _ = box.Stats(ctx)
	fmt.Println("pending:", s.Pending)
	// Output:
	// pending: 1
	// publish evt_1 to shop.order.paid: {"order":"ord_1"}
	// published: 1 <nil>
	// pending: 0
}
