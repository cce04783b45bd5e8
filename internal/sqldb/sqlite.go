package sqldb

import (
	"context"
	"database/sql"
	"time"
)

// SQLiteDSN is how the service opens its embedded database at path
// (modernc.org/sqlite): WAL, synchronous=NORMAL (a commit writes the WAL
// without fsync; a crashed process loses nothing, a lost power at most
// the last commits), BEGIN IMMEDIATE (a write transaction takes the write
// lock at BEGIN, so two never deadlock upgrading), a 10 s busy timeout.
// The WAL is checkpointed by CheckpointWAL off the commit path; the
// automatic checkpoint, at 10000 pages (about 40 MB), only catches up if
// that stops.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)" +
		"&_pragma=wal_autocheckpoint(10000)&_txlock=immediate"
}

// CheckpointEvery is how often CheckpointWAL copies the WAL into the
// database: about 15 pages a withdrawal at a few thousand a second keeps
// it at a few thousand pages.
const CheckpointEvery = 100 * time.Millisecond

// CheckpointWAL checkpoints db's WAL (PRAGMA wal_checkpoint(PASSIVE))
// every interval until ctx ends. SQLite's own automatic checkpoint runs
// in the commit that crosses its threshold, on that transaction's
// connection: every writer queued behind it waits for a copy of the WAL
// and an fsync. A PASSIVE checkpoint takes no write lock, so here it runs
// beside the writers. Errors are dropped: a checkpoint that could not
// finish (a reader on an old snapshot, SQLITE_BUSY) is done by the next.
func CheckpointWAL(ctx context.Context, db *sql.DB, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = db.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`)
		}
	}
}

// WriteGate lets one write transaction at a time begin, for a database
// with one writer (SQLite): the others queue here, in Go, instead of in
// SQLite's busy handler, which polls the write lock with sleeps of 1, 2,
// 5 ms and more while it may be free, and holds a connection of the small
// pool while it sleeps. A nil *WriteGate lets every transaction begin at
// once (PostgreSQL, MySQL). Only write transactions should pass it, and
// only those that pass it are queued: a writer that does not (a
// single-statement write, another store's transaction on the same
// database) still waits in the busy handler, and the gate's holder waits
// for it there.
type WriteGate struct{ ch chan struct{} }

// NewWriteGate returns an open WriteGate.
func NewWriteGate() *WriteGate { return &WriteGate{ch: make(chan struct{}, 1)} }

// Begin waits for the gate (or ctx) and begins a transaction on db. The
// caller calls done once the transaction is committed or rolled back;
// done may be called more than once.
func (g *WriteGate) Begin(ctx context.Context, db *sql.DB) (tx *sql.Tx, done func(), err error) {
	if g == nil {
		tx, err = db.BeginTx(ctx, nil)
		return tx, noop, err
	}
	select {
	case g.ch <- struct{}{}:
	case <-ctx.Done():
		return nil, noop, ctx.Err()
	}
	left := false
	done = func() {
		if !left {
			left = true
			<-g.ch
		}
	}
	if tx, err = db.BeginTx(ctx, nil); err != nil {
		done()
		return nil, noop, err
	}
	return tx, done, nil
}

func noop() {}
