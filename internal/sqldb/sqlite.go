package sqldb

import (
	"context"
	"database/sql"
	"reflect"
	"time"
)

// SQLiteDSN is how the service opens its embedded database at path
// (modernc.org/sqlite): WAL, synchronous=NORMAL (a commit writes the WAL
// without fsync; a crashed process loses nothing, a lost power at most
// the last commits), BEGIN IMMEDIATE (a write transaction takes the write
// lock at BEGIN, so two never deadlock upgrading), a 10 s busy timeout.
// The WAL is checkpointed by CheckpointWAL off the commit path; the
// automatic checkpoint, at 10000 pages (about 40 MB), only catches up if
// that stops. Temporary files are kept in memory (temp_store=MEMORY):
// among them the journal of a WriteGate member's savepoint, which SQLite
// otherwise spills to a file past 64 KiB, a write per page it saves; but
// also temporary tables, sorts too large for the cache and VACUUM's copy,
// with no bound: the service runs none of them on a large scale.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)" +
		"&_pragma=wal_autocheckpoint(10000)&_pragma=temp_store(MEMORY)&_txlock=immediate"
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

// SQLiteWatch is a WriteGate.Watch for modernc.org/sqlite: it registers
// rolledBack as the connection's rollback hook (sqlite3_rollback_hook,
// which SQLite calls on every rollback of a whole transaction, not on
// ROLLBACK TO a savepoint) and returns the function that removes it. It
// finds the connection's RegisterRollbackHook by reflection, so that this
// package imports no driver; a connection without one (another driver)
// reports ok false.
func SQLiteWatch(driverConn any, rolledBack func()) (stop func(), ok bool) {
	m := reflect.ValueOf(driverConn).MethodByName("RegisterRollbackHook")
	if !m.IsValid() {
		return nil, false
	}
	t := m.Type()
	if t.NumIn() != 1 || t.NumOut() != 0 {
		return nil, false
	}
	hook := t.In(0) // modernc.org/sqlite.RollbackHookFn, a func()
	if hook.Kind() != reflect.Func || hook.NumIn() != 0 || hook.NumOut() != 0 {
		return nil, false
	}
	m.Call([]reflect.Value{reflect.ValueOf(rolledBack).Convert(hook)})
	return func() { m.Call([]reflect.Value{reflect.Zero(hook)}) }, true
}
