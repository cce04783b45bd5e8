package sqllock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// overlap is a connector that counts the statements its connections run
// at once, keeping the most it saw.
type overlap struct {
	base          driver.Connector
	inflight, max atomic.Int32
	// hold, if set, is waited for by the next statement; fail, if set, is
	// the next statement's error. Each is used once.
	hold atomic.Pointer[chan struct{}]
	fail atomic.Pointer[error]
}

// dsnConnector opens dsn with d, for a driver without OpenConnector.
type dsnConnector struct {
	d   driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.d }

func (o *overlap) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := o.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &overlapConn{Conn: c, o: o}, nil
}

func (o *overlap) Driver() driver.Driver { return o.base.Driver() }

type overlapConn struct {
	driver.Conn
	o *overlap
}

// enter counts a statement in, waits for a hold and takes a failure set
// for it; the function it returns counts it out.
func (c *overlapConn) enter() (func(), error) {
	n := c.o.inflight.Add(1)
	for m := c.o.max.Load(); n > m && !c.o.max.CompareAndSwap(m, n); m = c.o.max.Load() {
	}
	out := func() { c.o.inflight.Add(-1) }
	if h := c.o.hold.Swap(nil); h != nil {
		<-*h
	}
	if err := c.o.fail.Swap(nil); err != nil {
		return out, *err
	}
	return out, nil
}

func (c *overlapConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	out, err := c.enter()
	defer out()
	if err != nil {
		return nil, err
	}
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *overlapConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	out, err := c.enter()
	defer out()
	if err != nil {
		return nil, err
	}
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *overlapConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// overlapBackend is a migrated SQLite Backend on a fresh file, its
// connections counted by the overlap it returns.
func overlapBackend(t *testing.T) (*sqllock.Backend, *overlap) {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "turn.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	opened, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	o := &overlap{base: dsnConnector{opened.Driver(), dsn}}
	opened.Close()
	db := sql.OpenDB(o)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(8)
	b, err := sqllock.New(db, sqldialect.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b, o
}

// On SQLite the Backend's statements reach the database one at a time
// (its turn queue): blocked Acquires polling on connections of their own
// would otherwise keep the single write lock busy and starve a Release
// past its timeout. Many goroutines acquiring, refreshing and releasing a
// few keys never have two statements in flight.
func TestSQLiteStatementsOneAtATime(t *testing.T) {
	b, o := overlapBackend(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			key := fmt.Sprint("turn-", g%3)
			for i := range 40 {
				owner := fmt.Sprint("o-", g, "-", i)
				_, err := b.Acquire(ctx, lock.Request{Key: key, Owner: owner, TTL: time.Minute})
				if errors.Is(err, lock.ErrNotAcquired) {
					continue
				} else if err != nil {
					errs <- err
					return
				}
				if err := b.Refresh(ctx, key, owner, time.Minute); err != nil {
					errs <- err
					return
				}
				if err := b.Release(ctx, key, owner); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if m := o.max.Load(); m != 1 {
		t.Fatalf("%d statements of the Backend ran at once on SQLite; want 1 (its turn queue)", m)
	}
	if o.inflight.Load() != 0 {
		t.Fatalf("%d statements still counted in flight", o.inflight.Load())
	}
}

// A caller waiting for the turn leaves with its context, and an Acquire
// whose statement failed gives the turn back: neither leaves the Backend
// stuck.
func TestSQLiteTurnLeftAndGivenBack(t *testing.T) {
	b, o := overlapBackend(t)
	ctx := context.Background()
	hold := make(chan struct{})
	o.hold.Store(&hold)
	held := make(chan error, 1)
	go func() { // holds the turn, its statement stopped
		_, err := b.Acquire(ctx, lock.Request{Key: "held", Owner: "h", TTL: time.Minute})
		held <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); o.hold.Load() != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the holding Acquire never ran its statement")
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- b.Release(short, "other", "o") }()
	select {
	case err := <-released:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Release waiting for the turn = %v; want DeadlineExceeded, its context's", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("Release waiting for the turn did not leave with its context (100ms) within 5s")
	}
	close(hold)
	if err := <-held; err != nil {
		t.Fatalf("the holding Acquire = %v", err)
	}

	broken := errors.New("disk I/O error")
	o.fail.Store(&broken)
	if _, err := b.Acquire(ctx, lock.Request{Key: "k", Owner: "a", TTL: time.Minute}); !errors.Is(err, broken) {
		t.Fatalf("Acquire with a failing statement = %v; want its error", err)
	}
	again, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	if _, err := b.Acquire(again, lock.Request{Key: "k", Owner: "b", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire after a failed one = %v; want the lock: the turn given back", err)
	}
}
