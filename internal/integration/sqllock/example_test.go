package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// A lock in your own database (here a SQLite file; PostgreSQL and MySQL
// take the same calls): the table is created on first use, a second
// holder is refused, and the fence grows with every acquire.
func Example() {
	dir, _ := os.MkdirTemp("", "sqllock-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)")
	defer db.Close()

	ctx := context.Background()
	backend, err := sqllock.New(db, sqldialect.SQLite, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	locker := lock.New(backend, nil)
	first, err := locker.TryAcquire(ctx, "account:alice", 10*time.Second)
	fmt.Println("first:", err)
	_, err = locker.TryAcquire(ctx, "account:alice", 10*time.Second)
	fmt.Println("second while held:", err)
	_ = first.Release(ctx)
	again, err := locker.TryAcquire(ctx, "account:alice", 10*time.Second)
	fmt.Println("after release:", err, again.Fence() > first.Fence())
	_ = again.Release(ctx)
	// Output:
	// first: <nil>
	// second while held: sqllock: acquire "account:alice": lock: not acquired
	// after release: <nil> true
}
