package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// A queue consumer whose effect is a row in the same database: DoTx
// commits the row and the message's record together, so a redelivered
// message is a replay, never a second row, even after a crash between the
// two.
func ExampleStore_DoTx() {
	dir, _ := os.MkdirTemp("", "dotx")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)")
	defer db.Close()
	_, _ = db.Exec(`CREATE TABLE invoices (msg TEXT PRIMARY KEY)`)
	store, err := sqlstore.New(db, sqldialect.SQLite, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	scope := idempotency.Scope{Principal: "billing-worker", Method: "invoice.send"}
	send := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO invoices (msg) VALUES ('msg-42')`); err != nil {
			return nil, err
		}
		return []byte("invoice 42 sent"), nil
	}
	for range 2 { // the queue delivered it twice
		res, replayed, err := store.DoTx(context.Background(), scope, "msg-42", "v1", nil, send)
		fmt.Println(string(res), replayed, err)
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM invoices`).Scan(&n)
	fmt.Println(n, "row")
	// Output:
	// invoice 42 sent false <nil>
	// invoice 42 sent true <nil>
	// 1 row
}
