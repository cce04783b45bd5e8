package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"time"
)

// walCommits reads the change counter of an SQLite database in WAL mode
// from its wal-index (the "-shm" file next to it, shared memory of every
// connection): the iChange field of the wal-index header (offset 8, the
// writer's byte order), which SQLite increments once per write
// transaction committed to the WAL (sqlite3WalFrames with isCommit) and
// nowhere else, not even when a checkpoint restarts the WAL. The header
// is written twice (48 bytes each); a reader retries until both copies
// agree, as SQLite does. It counts only while the database is open (the
// wal-index is rebuilt on the first open), so read it between a
// process's start and its stop. Read-only transactions and transactions
// that changed nothing are not counted.
func walCommits(dbPath string) (uint32, bool) {
	f, err := os.Open(dbPath + "-shm")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var b [96]byte
	for range 100 {
		if _, err := f.ReadAt(b[:], 0); err != nil {
			return 0, false
		}
		if n, ok := walIndexChange(b[:]); ok {
			return n, true
		}
		time.Sleep(time.Millisecond)
	}
	return 0, false
}

// walIndexChange is iChange of a consistent, initialised wal-index header.
func walIndexChange(b []byte) (uint32, bool) {
	if len(b) < 96 || !bytes.Equal(b[:48], b[48:96]) || b[12] != 1 { // isInit
		return 0, false
	}
	return binary.NativeEndian.Uint32(b[8:12]), true
}
