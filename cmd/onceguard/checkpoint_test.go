package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/onceguard/onceguard/sqldialect"
)

// The embedded database's WAL is copied into the database file by the
// service's own checkpoints, beside the writers: a few dozen pages
// committed, far below SQLite's automatic threshold (10000 pages), reach
// the database file without another commit.
func TestSQLiteCheckpoints(t *testing.T) {
	dir := t.TempDir()
	db, dialect, _, err := openDB(serveConfig{dataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if dialect != sqldialect.SQLite {
		t.Fatalf("dialect %v; want SQLite", dialect)
	}
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE cp (b BLOB)`); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "onceguard.db")
	size := func() int64 {
		fi, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	stop := checkpoints(db, dialect)
	defer stop()
	before := size()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	row := bytes.Repeat([]byte{'x'}, 1000)
	for range 200 { // about 50 pages
		if _, err := tx.ExecContext(ctx, `INSERT INTO cp (b) VALUES (?)`, row); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); size() < before+150_000; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the database file is %d bytes (%d before the commit): the WAL was never checkpointed", size(), before)
		}
	}
}
