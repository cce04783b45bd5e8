// Package sqllock is the database backend of package lock, on the caller's
// *sql.DB: PostgreSQL, MySQL/MariaDB or SQLite. It imports no driver; open
// the database with the driver you already use (pgx's stdlib, lib/pq,
// go-sql-driver/mysql, modernc.org/sqlite, mattn/go-sqlite3).
//
// Locks are rows of one table, keyed by the lock's name (stored as bytes:
// no hashing, so no collisions), with the owner token, the expiry and the
// last fencing token. Every operation is one autocommit statement:
// acquire is an upsert that takes the row only when it is free or expired
// (INSERT ... ON CONFLICT DO UPDATE ... WHERE, or ON DUPLICATE KEY UPDATE),
// release and refresh are UPDATEs conditional on the owner token. Nothing
// is held on a connection between statements, so the backend is safe
// behind PgBouncer in transaction pooling mode and with database/sql's
// pool; session-scoped locks (pg_advisory_lock, GET_LOCK) are not. With
// pgx behind PgBouncer before 1.21, open the database with
// default_query_exec_mode=exec in the DSN: pgx's default caches prepared
// statements per server connection, which transaction pooling does not keep.
//
// Time: expiries and fences use the database server's clock (PostgreSQL,
// MySQL), never the client's; SQLite, which runs on the client's machine,
// uses that machine's clock. Fences are max(last + 1, now in µs), the same
// scheme as redislock, so a lock that moves between Redis and the database
// (package fallback) keeps fences that increase, up to the clock skew
// between the two servers.
//
// Expired rows are removed by acquires (one in every cleanupEvery deletes
// rows idle for longer than Options.Retention); no background process is
// needed. Blocked Acquires poll with jittered backoff (lock.Options).
//
// SQLite: open the file with WAL and a busy timeout, for example with
// modernc.org/sqlite "file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)",
// so that concurrent writers wait instead of failing with SQLITE_BUSY.
// A Backend on SQLite runs its own statements one at a time, queued in Go
// in order of arrival (see Backend.turn), so that a Release is not starved
// by the polls of blocked Acquires in SQLite's busy handler.
package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/sqldialect"
)

// Options configure a Backend. A nil *Options means all defaults.
type Options struct {
	// Table is the lock table's name: letters, digits and underscores.
	// Default: "onceguard_locks".
	Table string

	// Retention is how long a free or expired row (and so its last fence)
	// is kept. Default: 1h.
	Retention time.Duration

	// Logged makes the PostgreSQL table a regular table. By default it is
	// UNLOGGED: its writes skip the WAL, which makes a lock cycle several
	// times cheaper, at the price that a crash or a failover to a replica
	// empties it, releasing every lock. Fences are time-based and keep
	// increasing across that; correctness must not rest on the lock anyway.
	// Default: false (unlogged).
	Logged bool
}

// Backend implements lock.Backend on a *sql.DB. It is safe for concurrent
// use.
type Backend struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	opts    Options
	q       queries

	migrated atomic.Bool
	migrate  sync.Mutex
	acquires atomic.Uint64

	// turns, on SQLite only, lets one statement of this Backend's run at a
	// time: a one-slot semaphore whose blocked senders are served in
	// order of arrival (see turn).
	turns chan struct{}
}

var _ lock.Backend = (*Backend)(nil)

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns a Backend on db, which stays the caller's to configure and
// close; lock.New makes a Locker of it. It does no I/O: the table is
// created by Migrate, or by the first operation that needs it. It returns
// an error for an unknown dialect or a bad table name.
func New(db *sql.DB, dialect sqldialect.Dialect, opts *Options) (*Backend, error) {
	if db == nil {
		return nil, errors.New("sqllock: New needs a *sql.DB")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = "onceguard_locks"
	}
	if !tableName.MatchString(o.Table) {
		return nil, fmt.Errorf("sqllock: table name %q: want letters, digits and underscores", o.Table)
	}
	if o.Retention <= 0 {
		o.Retention = time.Hour
	}
	if db == nil {
		return nil, errors.New("sqllock: nil *sql.DB")
	}
	q, err := buildQueries(dialect, o)
	if err != nil {
		return nil, err
	}
	b := &Backend{db: db, dialect: dialect, opts: o, q: q}
	if dialect == sqldialect.SQLite {
		b.turns = make(chan struct{}, 1)
	}
	return b, nil
}

// turn waits for this Backend's turn to run a statement on SQLite (at
// once on the other databases) and returns the function that ends it, or
// ctx's error.
//
// SQLite has one writer, and a connection that finds the write lock taken
// waits in the busy handler, which retries after sleeps that grow to
// 100ms. A writer that has waited long sleeps longest, so while blocked
// Acquires keep polling (each a write, on a connection of its own) the
// write lock is almost never free when it looks: under load a Release
// waited past its 5s ReleaseTimeout and failed, leaving the lock held
// until its TTL. Queued here, the Backend's statements reach SQLite one
// at a time and take the write lock at once; the queue is first come,
// first served, so a Release waits for at most the statements already
// queued, and a caller whose context ends leaves it.
func (b *Backend) turn(ctx context.Context) (func(), error) {
	if b.turns == nil {
		return func() {}, nil
	}
	select {
	case b.turns <- struct{}{}:
		return func() { <-b.turns }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Migrate creates the lock table if it does not exist. It is safe to run
// from several processes at once.
func (b *Backend) Migrate(ctx context.Context) error {
	if b.migrated.Load() {
		return nil
	}
	b.migrate.Lock()
	defer b.migrate.Unlock()
	if b.migrated.Load() {
		return nil
	}
	if err := sqldb.Create(ctx, b.db, b.q.create); err != nil {
		return wrap("migrate", b.opts.Table, err)
	}
	b.migrated.Store(true)
	return nil
}

// Acquire implements lock.Backend.
func (b *Backend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if err := b.Migrate(ctx); err != nil {
		return lock.Grant{}, err
	}
	ttl := r.TTL.Microseconds()
	done, err := b.turn(ctx)
	if err != nil {
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	fence, won, err := b.q.acquire(ctx, b.db, []byte(r.Key), r.Owner, ttl, b.now())
	done()
	if err != nil {
		if ctx.Err() != nil || unavailable(err) {
			// The answer may be lost with the lock taken: give it back.
			b.giveBack(ctx, r.Key, r.Owner)
		}
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	if b.acquires.Add(1)%cleanupEvery == 0 {
		b.cleanup(ctx)
	}
	if !won {
		return lock.Grant{}, fmt.Errorf("sqllock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
	}
	return lock.Grant{Fence: fence}, nil
}

// giveBackTimeout bounds the release that gives back a lock an acquire
// whose answer was lost may have taken.
const giveBackTimeout = 3 * time.Second

// giveBack releases the lock an acquire whose answer was lost (its
// connection broke, or its context ended, after the statement was sent)
// may have taken for owner, so that it is not left held for its TTL with
// nobody holding it. The release compares the owner: it never frees
// another holder's lock.
func (b *Backend) giveBack(ctx context.Context, key, owner string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	_ = b.Release(rctx, key, owner)
}

// cleanupEvery is how many acquires pass between two cleanups.
const cleanupEvery = 256

func (b *Backend) cleanup(ctx context.Context) {
	// Best effort: a failure leaves rows for the next cleanup.
	done, err := b.turn(ctx)
	if err != nil {
		return
	}
	defer done()
	_, _ = b.db.ExecContext(ctx, b.q.cleanup, b.now(), b.opts.Retention.Microseconds())
}

// Release implements lock.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if err := b.Migrate(ctx); err != nil {
		return err
	}
	done, err := b.turn(ctx)
	if err != nil {
		return wrap("release", key, err)
	}
	defer done()
	res, err := b.exec(ctx, b.q.release, b.now(), []byte(key), owner)
	return b.changed(ctx, "release", key, owner, res, err)
}

// Refresh implements lock.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := b.Migrate(ctx); err != nil {
		return err
	}
	done, err := b.turn(ctx)
	if err != nil {
		return wrap("refresh", key, err)
	}
	defer done()
	res, err := b.exec(ctx, b.q.refresh, b.now(), ttl.Microseconds(), []byte(key), owner)
	return b.changed(ctx, "refresh", key, owner, res, err)
}

// exec runs a release or refresh, again on a serialization failure (a
// PostgreSQL whose default isolation is SERIALIZABLE or REPEATABLE READ
// refuses a statement that raced another: it changed nothing, and the
// conditional UPDATE is safe to run again).
func (b *Backend) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	for try := 0; ; try++ {
		res, err := b.db.ExecContext(ctx, q, args...)
		if err == nil || try == 2 || !serializationFailure(err) || ctx.Err() != nil {
			return res, err
		}
	}
}

// changed turns the result of a conditional UPDATE into nil, ErrExpired or
// ErrNotHeld. When no row changed it asks who holds the lock: MySQL may
// report 0 rows for an UPDATE that matched but changed nothing.
func (b *Backend) changed(ctx context.Context, op, key, owner string, res sql.Result, err error) error {
	if err != nil {
		return wrap(op, key, err)
	}
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return nil
	}
	var holder sql.NullString
	var live bool
	err = b.db.QueryRowContext(ctx, b.q.holder, b.now(), []byte(key)).Scan(&holder, &live)
	switch {
	case errors.Is(err, sql.ErrNoRows) || (err == nil && (!holder.Valid || !live)):
		return fmt.Errorf("sqllock: %s %q: %w", op, key, lock.ErrExpired)
	case err != nil:
		return wrap(op, key, err)
	case holder.String == owner && op == "refresh":
		return nil // matched, same expiry to the microsecond
	}
	return fmt.Errorf("sqllock: %s %q: %w", op, key, lock.ErrNotHeld)
}

// now is the client's clock in µs, used only by SQLite queries; the others
// ignore the argument and read the server's clock.
func (b *Backend) now() int64 { return time.Now().UnixMicro() }

func wrap(op, key string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("sqllock: %s %q: %w: %w", op, key, lock.ErrUnavailable, err)
	}
	return fmt.Errorf("sqllock: %s %q: %w", op, key, err)
}

// unavailable reports errors that mean the database could not be reached
// or could not answer now.
func unavailable(err error) bool { return sqldb.Unavailable(err) }
