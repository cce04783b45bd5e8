package sqllock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// XactBackend is a PostgreSQL lock.Backend on transaction-scoped advisory
// locks: a lease is an open transaction that took
// pg_try_advisory_xact_lock, and releasing it commits that transaction. It
// writes nothing, so a lock cycle costs what a bare
// BEGIN; SELECT pg_try_advisory_xact_lock(k); COMMIT costs, several times
// less than the lock table (Backend), and it needs no table.
//
// The TTL is enforced by the server: the transaction sets
// idle_in_transaction_session_timeout to the TTL, so a holder that goes
// quiet (crashed, paused, partitioned) has its session ended by
// PostgreSQL and the lock freed; Refresh resets that timer. A holder whose
// process dies frees the lock at once, with its connection.
//
// The price: every held lease pins one connection of the pool (size the
// pool for the locks held at once, plus the rest of the work), and a
// lease cannot be released from another process. Being transaction-scoped
// it is safe behind PgBouncer in transaction pooling mode.
//
// Keys are hashed to 64 bits: the first 8 bytes of SHA-256 of the name,
// as the advisory lock's bigint key. Two names collide with probability
// about n²/2⁶⁵ for n names in use at once (for a million, 3·10⁻⁸); a
// collision makes two locks exclusive of each other, never one lock held
// twice.
//
// Fences are the server's clock in µs read after the lock was taken, so a
// holder's fence is larger than every earlier holder's as long as the
// server's clock does not step back; they need no write. Where fences must
// increase even across a clock step, use Backend (the lock table), whose
// fences are max(last + 1, now).
type XactBackend struct {
	db *sql.DB

	mu   sync.Mutex
	held map[string]*xactLease // owner token -> the lease's transaction
}

// xactLease is a held lease: its transaction, and a timer that rolls it
// back once the TTL has surely passed, so that a lease nobody releases
// (the caller forgot, or gave up after the server ended the session) does
// not keep a pooled connection and its goroutine forever.
type xactLease struct {
	tx    *sql.Tx
	sweep *time.Timer
	// turn lets one statement at a time on tx (a caller's Refresh beside a
	// renewal, a Release): database/sql locks the connection per driver
	// call only, and two statements interleaved on one pgx connection
	// fail ("conn busy") or panic. A slot taken is sent; made with room
	// for one.
	turn chan struct{}
	// until, under XactBackend.mu, is when the server ends the session if
	// no statement reaches it: the last statement's start plus its TTL.
	until time.Time
}

// sweepGrace is how long after its TTL an unreleased lease is rolled back.
const sweepGrace = time.Second

// goneTimeout bounds the probe that tells, after a lease's session ended,
// whether another owner holds the lock.
const goneTimeout = time.Second

var _ lock.Backend = (*XactBackend)(nil)

// NewXact returns an XactBackend on db, a PostgreSQL database; lock.New
// makes a Locker of it.
func NewXact(db *sql.DB) (*XactBackend, error) {
	if db == nil {
		return nil, errors.New("sqllock: nil *sql.DB")
	}
	return &XactBackend{db: db, held: make(map[string]*xactLease)}, nil
}

// AdvisoryKey returns the 64-bit advisory lock key of a lock name.
func AdvisoryKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

const xactAcquire = `SELECT CASE WHEN pg_try_advisory_xact_lock($1)
  THEN (extract(epoch from clock_timestamp()) * 1000000)::bigint ELSE 0 END,
  set_config('idle_in_transaction_session_timeout', $2, true)`

// Acquire implements lock.Backend.
func (b *XactBackend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	start := time.Now()
	// The transaction outlives this call: it must not end with ctx.
	tx, err := b.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	var fence int64
	var timeout string
	err = tx.QueryRowContext(ctx, xactAcquire, AdvisoryKey(r.Key), strconv.FormatInt(max(r.TTL.Milliseconds(), 1), 10)).Scan(&fence, &timeout)
	if err != nil || fence == 0 {
		_ = tx.Rollback()
		if err != nil {
			return lock.Grant{}, wrap("acquire", r.Key, err)
		}
		return lock.Grant{}, fmt.Errorf("sqllock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
	}
	owner := r.Owner
	b.mu.Lock()
	b.held[owner] = &xactLease{tx: tx, turn: make(chan struct{}, 1), until: start.Add(r.TTL), sweep: time.AfterFunc(r.TTL+sweepGrace, func() {
		if tx := b.take(owner); tx != nil {
			_ = tx.Rollback()
		}
	})}
	b.mu.Unlock()
	return lock.Grant{Fence: fence}, nil
}

func (b *XactBackend) take(owner string) *sql.Tx {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.held[owner]
	if l == nil {
		return nil
	}
	delete(b.held, owner)
	l.sweep.Stop()
	return l.tx
}

// lease returns owner's held lease, and takes its turn (see xactLease.turn),
// or returns an error: ErrExpired when it is not held, the cause of ctx's
// end when that comes first (nothing was sent). The caller gives the turn
// back (<-l.turn).
func (b *XactBackend) lease(ctx context.Context, op, key, owner string) (*xactLease, error) {
	b.mu.Lock()
	l := b.held[owner]
	b.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("sqllock: %s %q: %w", op, key, lock.ErrExpired)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, wrap(op, key, context.Cause(ctx))
	}
	if ctx.Err() != nil { // both were ready
		<-l.turn
		return nil, wrap(op, key, context.Cause(ctx))
	}
	return l, nil
}

// Release implements lock.Backend: it commits the lease's transaction,
// after a refresh on its way (waiting for it within ctx). A session the
// server ended for idleness (the TTL passed) gives ErrExpired. The COMMIT
// itself takes no context (database/sql's Tx.Commit): on a connection
// that stopped answering it waits for the network, whatever ctx says.
func (b *XactBackend) Release(ctx context.Context, key, owner string) error {
	l, err := b.lease(ctx, "release", key, owner) // a refresh on its way finishes first
	if err != nil {
		return err
	}
	defer func() { <-l.turn }()
	tx := b.take(owner)
	if tx == nil {
		return fmt.Errorf("sqllock: release %q: %w", key, lock.ErrExpired)
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("sqllock: release %q: %w (%v)", key, b.gone(ctx, key), err)
	}
	return nil
}

// gone tells, for a lease whose session ended, whether another owner holds
// the lock now (ErrNotHeld) or nobody does (ErrExpired).
func (b *XactBackend) gone(ctx context.Context, key string) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return lock.ErrExpired
	}
	defer func() { _ = tx.Rollback() }() // frees the probe's lock
	var free bool
	if err := tx.QueryRowContext(ctx, `SELECT pg_try_advisory_xact_lock($1)`, AdvisoryKey(key)).Scan(&free); err == nil && !free {
		return lock.ErrNotHeld
	}
	return lock.ErrExpired
}

// Refresh implements lock.Backend: one statement on the lease's
// transaction resets the server's idle timer and sets the new TTL.
//
// A statement that ends early breaks the transaction that holds the lock
// (PostgreSQL aborts a transaction on an error, and the driver breaks the
// connection under a statement whose context ends), so ctx's cancellation
// does not end it: it runs until it is answered, ctx's deadline, or the
// time the server would end the idle session anyway. Any failure ends the
// lease's transaction and returns ErrExpired, or ErrNotHeld when another
// owner holds the lock by then.
func (b *XactBackend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	l, err := b.lease(ctx, "refresh", key, owner) // nothing sent yet: giving up there is harmless
	if err != nil {
		return err
	}
	defer func() { <-l.turn }()
	b.mu.Lock()
	held, until := b.held[owner] == l, l.until // read now: the statement before may have moved it
	b.mu.Unlock()
	if !held { // released, or rolled back, while this waited
		return fmt.Errorf("sqllock: refresh %q: %w", key, lock.ErrExpired)
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		until = dl
	}
	sent := time.Now()
	qctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	var s string
	err = l.tx.QueryRowContext(qctx, `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`,
		strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)).Scan(&s)
	if err != nil {
		// The session is gone, or goes with the rollback: the lock is free.
		if tx := b.take(owner); tx != nil {
			_ = tx.Rollback()
		}
		gctx, gcancel := context.WithTimeout(context.WithoutCancel(ctx), goneTimeout)
		defer gcancel()
		return fmt.Errorf("sqllock: refresh %q: %w (%v)", key, b.gone(gctx, key), err)
	}
	b.mu.Lock()
	l.until = sent.Add(ttl)
	b.mu.Unlock()
	l.sweep.Reset(ttl + sweepGrace)
	return nil
}
