package main

import (
	"database/sql"
	"encoding/binary"
	"path/filepath"
	"testing"
)

// The WAL index' change counter counts write transactions, opened as the
// service opens its database: not reads, not a transaction that changed
// nothing.
func TestWALCommitsCountsWriteTransactions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "floor.db")
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(floorSQLiteSchema); err != nil {
		t.Fatal(err)
	}
	c0, ok := walCommits(path)
	if !ok {
		t.Fatal("no change counter after the schema")
	}
	if _, err := db.Exec(`INSERT INTO accounts (balance) VALUES (100)`); err != nil { // 1
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var b int64
	if err := tx.QueryRow(`UPDATE accounts SET balance = balance + $1 WHERE aid = 1 AND balance + $1 >= 0 RETURNING balance`, -30).Scan(&b); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO ledger (aid, kind, amount, balance_after, ref, created_at) VALUES (1, 'withdrawal', -30, $1, 'r1', 0)`, b); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // 2
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT balance FROM accounts WHERE aid = 1`).Scan(&b); err != nil || b != 70 { // a read
		t.Fatal(b, err)
	}
	if err := db.QueryRow(`UPDATE accounts SET balance = balance - 1000 WHERE aid = 1 AND balance - 1000 >= 0 RETURNING balance`).Scan(&b); err != sql.ErrNoRows { // changed nothing
		t.Fatal(err)
	}
	c1, ok := walCommits(path)
	if !ok || c1-c0 != 2 {
		t.Fatalf("change counter %d -> %d (%v), want 2 more", c0, c1, ok)
	}
}

func TestWALIndexChangeWantsAgreeingCopies(t *testing.T) {
	var b [96]byte
	for _, off := range []int{0, 48} {
		binary.NativeEndian.PutUint32(b[off+8:], 42)
		b[off+12] = 1
	}
	if n, ok := walIndexChange(b[:]); !ok || n != 42 {
		t.Fatalf("%d %v, want 42", n, ok)
	}
	b[48+8]++ // a writer between the two copies
	if _, ok := walIndexChange(b[:]); ok {
		t.Fatal("copies that differ read as a counter")
	}
}
