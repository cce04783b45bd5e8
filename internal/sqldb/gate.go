package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// WriteGate runs write transactions one at a time, for a database with one
// writer (SQLite), and commits those that queue behind each other as one
// (group commit).
//
// Queued in Go, a writer does not wait in SQLite's busy handler, which
// polls the write lock with sleeps of 1, 2, 5 ms and more while it may be
// free, and holds a connection of the small pool while it sleeps. Grouped,
// the pages that every transaction writes (a table's last leaf, an index's
// right edge) go to the WAL once per group, and so do the commit's own
// frames: on SQLite the commit is most of a short transaction's time.
//
// A transaction runs alone (BEGIN, its statements in a SAVEPOINT, COMMIT)
// unless others are waiting when it is done: then its holder runs theirs
// in the same database transaction, each in a SAVEPOINT of its own (a
// failure rolls back its work only, RELEASE keeps it), up to MaxGroup of
// them, and commits them all at once. Every Run returns once the group's COMMIT is
// done: an error from it is every member's (ErrGroupLost). With Watch set,
// members run without a savepoint until one fails (see Watch).
//
// Only write transactions that pass the gate are queued: a writer that does
// not (a single-statement write, another store's transaction on the same
// database) still waits in SQLite's busy handler, and the gate's holder
// waits for it there.
//
// A nil *WriteGate runs every transaction at once, alone (PostgreSQL,
// MySQL).
type WriteGate struct {
	// MaxGroup is how many transactions one COMMIT may hold; less than 2
	// commits each alone (the gate only queues).
	MaxGroup int
	// OnCommit, if set, is told after each group's COMMIT (a failed one
	// too) how many transactions it held and how many Runs were queued
	// behind it then: for metrics. Set it before the first Run.
	OnCommit func(members, waiting int)
	// Watch, if set, lets a group run its members without a savepoint
	// each, which costs SQLite a statement journal per member (measured:
	// 7-11 % of the service's withdrawals/s on SQLite). It is called with
	// the driver's connection (database/sql's Conn.Raw) of each group and
	// must arrange for rolledBack to be called whenever the connection's
	// transaction is rolled back whole (SQLite's rollback hook: an explicit
	// ROLLBACK, or one SQLite makes itself under a failing statement, on
	// SQLITE_FULL or an I/O error); it returns the function that undoes
	// that (called in a later Conn.Raw), or ok false if the connection
	// cannot tell, and then the group's members run in savepoints. A member
	// that fails with its work in a group of others rolls back the group's
	// transaction, and the group runs again from its first member, each in a
	// savepoint: a function may be called twice, so it must do nothing but
	// its statements (which Run asks anyway), and only its last call's work
	// commits. A group after one with a failure starts with savepoints.
	// Set it before the first Run.
	Watch func(driverConn any, rolledBack func()) (stop func(), ok bool)

	mu    sync.Mutex
	db    *sql.DB // the database of every Run (the first's)
	busy  bool    // a holder is running transactions
	queue []*job  // waiting, in order of arrival
	// careful: the last group had a member fail, so the next one starts
	// with savepoints (Watch). Guarded by mu.
	careful bool
}

// DefaultMaxGroup is NewWriteGate's MaxGroup: a group waits for its
// members' statements, so the cap bounds the latency a group adds (a
// service withdrawal's transaction runs in a fraction of a millisecond).
const DefaultMaxGroup = 16

// holderYields is how many times a holder with room left in its group
// yields its processor (runtime.Gosched) for a Run to join before it
// commits. Callers whose Run is due are often runnable but not running
// (on two cores, a service's handlers and its clients wait for one): a
// holder that commits at once takes a group of three or four where the
// same load fills one of ten, and every COMMIT writes its pages to the
// WAL again; a yield costs nothing when nothing else is runnable. Measured
// with the service at 16 clients (bench/load): groups of 3.5-4.2 became
// 9.7-10, withdrawals/s +10-17%; at 64 clients groups were full already.
const holderYields = 2

// NewWriteGate returns an open WriteGate that groups up to
// DefaultMaxGroup transactions per commit.
func NewWriteGate() *WriteGate { return &WriteGate{MaxGroup: DefaultMaxGroup} }

// A job is one Run waiting for its turn.
type job struct {
	ctx context.Context // the caller's, to leave the queue with
	fn  func(context.Context, *sql.Tx) error
	out chan outcome // one outcome, then done
}

// An outcome is what a job's Run returns: its error, or that it holds the
// gate now (lead), or its function's panic, raised again in its caller.
type outcome struct {
	err      error
	lead     bool
	panicked *PanicError
}

// failed reports whether the outcome is a function's failure: its error or its panic.
func (o outcome) failed() bool { return o.err != nil || o.panicked != nil }

// ErrGroupLost is wrapped by the error of every member of a group whose
// transaction was lost: its COMMIT failed, or SQLite rolled it back whole
// (SQLITE_FULL, an I/O error) under a member's statement. Nothing of the
// group was committed.
var ErrGroupLost = errors.New("sqldb: the group's transaction was rolled back")

// Run runs fn in a write transaction on db and commits it if fn returns
// nil; if fn returns an error, its work is rolled back and Run returns
// that error. A transaction fn's statements are run with ctx's values but
// not its cancellation: through a gate, fn may share its transaction with
// others, and SQLite interrupted in a statement rolls back the whole
// transaction. While it waits for its turn, Run gives up with ctx; once
// fn has run, Run waits for the COMMIT, whatever ctx does, so that it
// never reports as failed work that commits. fn must do nothing but its
// transaction's statements (no Run on the same gate), return every error
// they return (SQLite may have rolled the transaction back with it), and
// do nothing after them that assumes the commit: that is the caller's,
// once Run returns nil. With Watch set fn may be called twice (its group
// ran again after another member failed): only its last call's work
// commits. fn may run on another goroutine (the holder's),
// so it must not call runtime.Goexit (t.FailNow); a panic of fn rolls back
// its work and is raised again in Run's caller, after the COMMIT, as a
// *PanicError with the stack fn panicked on. A gate serves one database:
// Run with another than its first returns an error.
//
// On a nil gate, Run is BeginTx(ctx), fn(ctx, tx), Commit, with ctx as
// given.
func (g *WriteGate) Run(ctx context.Context, db *sql.DB, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if g == nil {
		return alone(ctx, db, fn)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	j := &job{ctx: ctx, fn: fn, out: make(chan outcome, 1)}
	g.mu.Lock()
	if g.db == nil {
		g.db = db
	} else if g.db != db {
		g.mu.Unlock()
		return errors.New("sqldb: a WriteGate's transactions are on one database: Run with another *sql.DB")
	}
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		g.hold(db, j)
	} else {
		g.queue = append(g.queue, j)
		g.mu.Unlock()
	}
	var o outcome
	select {
	case o = <-j.out:
	case <-ctx.Done():
		if g.leave(j) {
			return ctx.Err()
		}
		o = <-j.out // taken already: its outcome follows
	}
	if o.lead {
		if err := ctx.Err(); err != nil { // gave up as its turn came
			g.pass()
			return err
		}
		g.hold(db, j)
		o = <-j.out
	}
	if o.panicked != nil {
		panic(o.panicked)
	}
	return o.err
}

// alone runs fn in a transaction of its own.
func alone(ctx context.Context, db *sql.DB, fn func(context.Context, *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

// Waiting returns how many Runs are queued behind the one that holds g.
func (g *WriteGate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// leave takes j out of the queue, if it is still there.
func (g *WriteGate) leave(j *job) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.queue {
		if q == j {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			return true
		}
	}
	return false
}

// next takes the first job of the queue whose caller still waits, or nil;
// those that gave up meanwhile are answered with their context's error.
// With nothing queued and free set, the gate is free when next returns.
func (g *WriteGate) next(free bool) *job {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.queue) > 0 {
		j := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		if err := j.ctx.Err(); err != nil {
			j.out <- outcome{err: err}
			continue
		}
		return j
	}
	if free {
		g.busy = false
	}
	return nil
}

// pass gives the gate to the first job queued, or frees it.
func (g *WriteGate) pass() {
	if j := g.next(true); j != nil {
		j.out <- outcome{lead: true}
	}
}

// hold runs first's transaction, with those queued behind it in the same
// one while it lasts (yielding holderYields times for more when none is
// queued and the group has room), commits, answers every member, and
// passes the gate to the next job queued (or frees it). Every member, the
// first too, runs in a savepoint, unless Watch lets them run bare: a
// function that let SQLite roll the whole transaction back (and went on,
// ignoring the error) is found by its RELEASE failing, or by the watch,
// before another member's statements could run outside the transaction.
// A member that failed is answered after the COMMIT too: its failure may
// have been decided by the work of one before it (a duplicate key, the
// funds left), which its caller must find committed when it looks.
func (g *WriteGate) hold(db *sql.DB, first *job) {
	defer g.pass()
	// The first's caller may give up while the pool has no connection for
	// the group; the transaction itself lives without its cancellation
	// (database/sql would roll it back under the other members).
	conn, err := db.Conn(first.ctx)
	if err != nil {
		first.out <- outcome{err: err}
		return
	}
	defer conn.Close()
	var rolled atomic.Bool // the watch saw the transaction rolled back whole
	bare := false          // members run without savepoints
	if g.Watch != nil && !g.isCareful() {
		var stop func()
		_ = conn.Raw(func(dc any) error {
			var ok bool
			stop, ok = g.Watch(dc, func() { rolled.Store(true) })
			bare = ok && stop != nil
			return nil
		})
		if bare {
			defer conn.Raw(func(any) error { stop(); return nil })
		}
	}
	ctx := context.WithoutCancel(first.ctx)
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		first.out <- outcome{err: err}
		return
	}
	var group []*job
	failed := map[*job]outcome{} // members whose function failed, with their outcome
	answered := false
	// committed: the COMMIT succeeded, so an answer the deferred function
	// below gives (OnCommit panicked) is each member's own, not ErrGroupLost.
	committed := false
	// The goroutine ends otherwise (a driver's panic, runtime.Goexit in a
	// function, OnCommit's panic).
	defer func() {
		if !answered {
			for _, m := range group {
				if committed {
					m.out <- failed[m]
				} else {
					m.out <- outcome{err: fmt.Errorf("%w: its holder stopped", ErrGroupLost)}
				}
			}
		}
	}()
	defer func() { _ = tx.Rollback() }() // tx is the last one begun
	lost := func(err error) {
		err = fmt.Errorf("%w: %w", ErrGroupLost, err)
		for _, m := range group {
			m.out <- outcome{err: err}
		}
		answered = true
	}
	// inSavepoint runs m in tx in a savepoint, and reports false when the
	// group is lost (answered).
	inSavepoint := func(m *job) bool {
		o, err := member(tx, m)
		if err != nil {
			lost(err)
			return false
		}
		if o.failed() {
			failed[m] = o
		}
		return true
	}
	kept := 0 // bare members whose work is in tx
	limit, yields := max(g.MaxGroup, 1), 0
	for j := first; ; j = g.next(false) {
		if j == nil {
			if yields == holderYields { // the group has room: it breaks below when full
				break
			}
			yields++
			runtime.Gosched()
			continue
		}
		group = append(group, j)
		if !bare {
			if !inSavepoint(j) {
				return
			}
		} else {
			o := call(context.WithoutCancel(j.ctx), j, tx)
			if rolled.Load() {
				lost(errors.New("sqldb: the transaction was rolled back under a member's statements"))
				return
			}
			if !o.failed() {
				kept++
			} else {
				// j's work is in tx, with the kept members' before it: take
				// it all back, and run the group again, each in a savepoint.
				if err := tx.Rollback(); err != nil {
					lost(err)
					return
				}
				// A new variable: on an error BeginTx returns a nil *sql.Tx,
				// which the deferred Rollback would dereference.
				again, err := conn.BeginTx(ctx, nil)
				if err != nil {
					lost(err)
					return
				}
				tx = again
				rolled.Store(false)
				if kept == 0 { // nothing but j's was undone: its failure stands
					failed[j] = o
				} else {
					bare = false
					clear(failed)
					for _, m := range group {
						if !inSavepoint(m) {
							return
						}
					}
				}
			}
		}
		if len(group) == limit {
			break // before next takes one more
		}
	}
	err = tx.Commit()
	committed = err == nil
	g.mu.Lock()
	g.careful = len(failed) > 0
	g.mu.Unlock()
	if g.OnCommit != nil {
		g.OnCommit(len(group), g.Waiting())
	}
	if err != nil {
		lost(err)
		return
	}
	for _, m := range group {
		m.out <- failed[m] // the zero outcome: committed
	}
	answered = true
}

// isCareful reports whether the last group had a member fail.
func (g *WriteGate) isCareful() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.careful
}

// member runs j's transaction in tx, in a savepoint: its work is kept, to
// be committed with the group's, or, if j's function failed, rolled back,
// and o is that failure. An error returned is the transaction's: the
// savepoint could not be set, released or rolled back to (SQLite, on
// SQLITE_FULL or an I/O error, rolls back the whole transaction).
func member(tx *sql.Tx, j *job) (o outcome, err error) {
	ctx := context.WithoutCancel(j.ctx)
	if _, err := tx.ExecContext(ctx, `SAVEPOINT onceguard_member`); err != nil {
		return o, err
	}
	if o = call(ctx, j, tx); o.failed() {
		if _, err := tx.ExecContext(ctx, `ROLLBACK TO onceguard_member`); err != nil {
			return o, err
		}
	}
	_, err = tx.ExecContext(ctx, `RELEASE onceguard_member`)
	return o, err
}

// A PanicError is the panic of a transaction's function, which Run raises
// again in its caller after the group's COMMIT: the function may have run
// on the goroutine of the Run that held the gate, so the panic carries the
// stack it was raised on. Errors.As and errors.Is see the panic's value
// when it is an error.
type PanicError struct {
	Value any    // what the function panicked with
	Stack []byte // the stack of the goroutine it panicked on (runtime/debug.Stack)
}

func (p *PanicError) Error() string {
	return fmt.Sprintf("sqldb: a transaction's function panicked: %v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns the panic's value if it is an error, else nil.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// call runs j's function in tx, its panic caught as its outcome.
func call(ctx context.Context, j *job, tx *sql.Tx) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = outcome{panicked: &PanicError{Value: p, Stack: debug.Stack()}}
		}
	}()
	return outcome{err: j.fn(ctx, tx)}
}
