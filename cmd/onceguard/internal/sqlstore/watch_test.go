package sqlstore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/internal/sqldb"
)

// sqldb.SQLiteWatch on the service's driver: the write gate's members run
// without savepoints only because SQLite tells it of a rollback of the
// whole transaction (then the gate gives the group up), and not of a
// ROLLBACK TO a savepoint (the gate's own, for a failed member once the
// group runs again with them).
func TestSQLiteWatchOnTheDriver(t *testing.T) {
	db, err := sql.Open("sqlite", sqldb.SQLiteDSN(filepath.Join(t.TempDir(), "w.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rolled := 0
	var stop func()
	var ok bool
	if err := conn.Raw(func(dc any) error { stop, ok = sqldb.SQLiteWatch(dc, func() { rolled++ }); return nil }); err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("SQLiteWatch found no rollback hook on modernc.org/sqlite's connection")
	}
	exec := func(q string) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE t (v INTEGER)`)
	exec(`BEGIN`)
	exec(`SAVEPOINT s`)
	exec(`INSERT INTO t VALUES (1)`)
	exec(`ROLLBACK TO s`)
	exec(`RELEASE s`)
	if rolled != 0 {
		t.Errorf("ROLLBACK TO a savepoint called the hook %d times; want 0", rolled)
	}
	exec(`INSERT INTO t VALUES (2)`)
	exec(`ROLLBACK`)
	if rolled != 1 {
		t.Errorf("a ROLLBACK called the hook %d times; want 1", rolled)
	}
	if err := conn.Raw(func(any) error { stop(); return nil }); err != nil {
		t.Fatal(err)
	}
	exec(`BEGIN`)
	exec(`ROLLBACK`)
	if rolled != 1 {
		t.Errorf("the hook ran after it was removed (%d calls)", rolled)
	}
}
