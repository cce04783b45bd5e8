package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDB is a database/sql driver that logs what its connections are
// asked to do (BEGIN, COMMIT, ROLLBACK, each statement) and fails a COMMIT
// when told to.
type fakeDB struct {
	mu         sync.Mutex
	log        []string
	failCommit error
	failBegin  error
	hook       fakeHook // the connections' rollback hook (SQLiteWatch)
}

// fakeHook is the type of a fake connection's rollback hook: a named
// func type, as modernc.org/sqlite's RollbackHookFn.
type fakeHook func()

// RegisterRollbackHook sets the hook, as modernc.org/sqlite's connections do (nil removes it).
func (c fakeConn) RegisterRollbackHook(h fakeHook) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.hook = h
}

// rolledBack calls the hook, if one is set.
func (f *fakeDB) rolledBack() {
	f.mu.Lock()
	h := f.hook
	f.mu.Unlock()
	if h != nil {
		h()
	}
}

func (f *fakeDB) add(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, s)
}

func (f *fakeDB) lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func (f *fakeDB) Connect(context.Context) (driver.Conn, error) { return fakeConn{f}, nil }
func (f *fakeDB) Driver() driver.Driver                        { return nil }

type fakeConn struct{ f *fakeDB }

func (fakeConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("no prepared statements")
}
func (fakeConn) Close() error      { return nil }
func (c fakeConn) Rollback() error { c.f.add("ROLLBACK"); c.f.rolledBack(); return nil }

func (c fakeConn) Begin() (driver.Tx, error) {
	c.f.mu.Lock()
	err := c.f.failBegin
	c.f.mu.Unlock()
	if err != nil {
		c.f.add("BEGIN failed")
		return nil, err
	}
	c.f.add("BEGIN")
	return c, nil
}

func (c fakeConn) Commit() error {
	c.f.mu.Lock()
	err := c.f.failCommit
	c.f.mu.Unlock()
	if err != nil {
		c.f.add("COMMIT failed")
		return err
	}
	c.f.add("COMMIT")
	return nil
}

func (c fakeConn) ExecContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Result, error) {
	c.f.add(query)
	if query == "disk full" { // as SQLite on SQLITE_FULL: the whole transaction is rolled back
		c.f.rolledBack()
		return nil, errors.New("database or disk is full")
	}
	return driver.RowsAffected(1), nil
}

func newFake(t *testing.T) (*fakeDB, *sql.DB) {
	f := &fakeDB{}
	db := sql.OpenDB(f)
	t.Cleanup(func() { db.Close() })
	return f, db
}

// exec is a transaction function that runs one statement, named s.
func exec(s string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s)
		return err
	}
}

// execThen is a transaction function that runs statement s, then fails
// with fail; it counts its calls in calls, if not nil.
func execThen(s string, fail error, calls *atomic.Int32) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		if calls != nil {
			calls.Add(1)
		}
		if err := exec(s)(ctx, tx); err != nil {
			return err
		}
		return fail
	}
}

// grouped holds g with a first transaction until n more Runs are queued
// behind it, runs them (fns[i] for the i-th queued, in order), and
// returns each Run's error, the first's at 0. Each Run's return is logged
// as "returned i", so the log says whether it came after the COMMIT.
func grouped(t *testing.T, g *WriteGate, f *fakeDB, db *sql.DB, fns ...func(context.Context, *sql.Tx) error) []error {
	t.Helper()
	ctx := context.Background()
	errs := make([]error, len(fns)+1)
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		errs[0] = g.Run(ctx, db, func(ctx context.Context, tx *sql.Tx) error {
			<-release
			return exec("first")(ctx, tx)
		})
		f.add("returned 0")
	})
	waitHeld(t, g)
	for i, fn := range fns {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[i+1] = panicked{p}
				}
				f.add(fmt.Sprintf("returned %d", i+1))
			}()
			errs[i+1] = g.Run(ctx, db, fn)
		})
		waitQueued(t, g, i+1) // queued in this order
	}
	close(release)
	wg.Wait()
	return errs
}

// isPanic reports whether err is a Run's panic with value v, raised with
// the stack of the function that panicked (in shows a frame of it).
func isPanic(err error, v any, in string) bool {
	p, ok := err.(panicked)
	if !ok {
		return false
	}
	pe, ok := p.v.(*PanicError)
	return ok && pe.Value == v && strings.Contains(string(pe.Stack), in)
}

// panicked is grouped's error for a Run that panicked.
type panicked struct{ v any }

func (p panicked) Error() string { return fmt.Sprint("panic: ", p.v) }

func waitHeld(t *testing.T, g *WriteGate) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		busy := g.busy
		g.mu.Unlock()
		if busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the first Run never held the gate")
		}
	}
}

func waitQueued(t *testing.T, g *WriteGate, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		q := len(g.queue)
		g.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Runs queued, want %d", q, n)
		}
	}
}

func wantLog(t *testing.T, f *fakeDB, want ...string) {
	t.Helper()
	got := f.lines()
	if !slices.Equal(got, want) {
		t.Errorf("the driver was asked:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// Runs queued behind a transaction share its COMMIT, each in a savepoint,
// in their order, and every one returns after that COMMIT.
func TestWriteGateGroupsQueuedRuns(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	var commits [][2]int
	g.OnCommit = func(members, waiting int) { commits = append(commits, [2]int{members, waiting}) }
	errs := grouped(t, g, f, db, exec("a"), exec("b"))
	if want := [][2]int{{3, 0}}; !slices.Equal(commits, want) {
		t.Errorf("OnCommit was told %v; want %v (one group of three, nothing queued behind it)", commits, want)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("Run %d = %v", i, err)
		}
	}
	log := f.lines()
	slices.Sort(log[len(log)-3:]) // the three returns, in any order
	want := []string{"BEGIN", "SAVEPOINT onceguard_member", "first", "RELEASE onceguard_member",
		"SAVEPOINT onceguard_member", "a", "RELEASE onceguard_member",
		"SAVEPOINT onceguard_member", "b", "RELEASE onceguard_member",
		"COMMIT", "returned 0", "returned 1", "returned 2"}
	if !slices.Equal(log, want) {
		t.Errorf("the driver was asked:\n\t%s\nwant:\n\t%s", strings.Join(log, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// A Run that is due but not yet running when the holder's group has no
// one queued joins it: the holder yields before it commits. With one
// processor, a goroutine started in the first member's function runs
// only when the holder lets it; without the yield it would commit alone.
func TestWriteGateHolderYieldsForLateRuns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f, db := newFake(t)
	g := NewWriteGate()
	var commits []int
	g.OnCommit = func(members, _ int) { commits = append(commits, members) }
	late := make(chan error, 1)
	err := g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error {
		go func() { late <- g.Run(context.Background(), db, exec("late")) }()
		return exec("first")(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-late; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(commits, []int{2}) {
		t.Errorf("groups %v; want one of two (the late Run in the first's)\n%s", commits, strings.Join(f.lines(), "\n"))
	}
}

// MaxGroup caps a group: the rest commit in the next, led by the first
// left out.
func TestWriteGateMaxGroup(t *testing.T) {
	f, db := newFake(t)
	g := &WriteGate{MaxGroup: 2}
	errs := grouped(t, g, f, db, exec("a"), exec("b"), exec("c"))
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var commits []string
	for _, l := range f.lines() {
		if l == "BEGIN" || l == "COMMIT" || len(l) == 1 || l == "first" {
			commits = append(commits, l)
		}
	}
	want := []string{"BEGIN", "first", "a", "COMMIT", "BEGIN", "b", "c", "COMMIT"}
	if !slices.Equal(commits, want) {
		t.Errorf("transactions %v; want %v", commits, want)
	}
	f2, db2 := newFake(t)
	if err := errors.Join(grouped(t, &WriteGate{MaxGroup: 1}, f2, db2, exec("a"))...); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(strings.Join(f2.lines(), " "), "COMMIT"); n != 2 {
		t.Errorf("MaxGroup 1: %d commits for two Runs; want each alone\n%v", n, f2.lines())
	}
}

// A member that fails is rolled back to its savepoint, alone, and its Run
// returns its error, after the group's COMMIT (its failure may rest on
// the work of one before it, which its caller must find committed).
func TestWriteGateFailedMember(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	refused := errors.New("refused")
	errs := grouped(t, g, f, db, exec("a"), execThen("b", refused, nil), exec("c"))
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || !errors.Is(errs[2], refused) {
		t.Errorf("Runs = %v; want nil, nil, refused, nil", errs)
	}
	log := f.lines()
	i := slices.Index(log, "b")
	if i < 0 || !slices.Equal(log[i:i+3], []string{"b", "ROLLBACK TO onceguard_member", "RELEASE onceguard_member"}) {
		t.Errorf("the failed member's work was not rolled back to its savepoint:\n%s", strings.Join(log, "\n"))
	}
	if c, r := slices.Index(log, "COMMIT"), slices.Index(log, "returned 2"); c < 0 || r < c {
		t.Errorf("the failed member returned before the COMMIT:\n%s", strings.Join(log, "\n"))
	}
}

// The first transaction's failure rolls back its savepoint only; those
// queued behind it commit in the same transaction, and the first's Run
// returns its error after that COMMIT.
func TestWriteGateFailedFirst(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	refused := errors.New("refused")
	release := make(chan struct{})
	var first, second error
	var wg sync.WaitGroup
	wg.Go(func() {
		first = g.Run(context.Background(), db, func(context.Context, *sql.Tx) error { <-release; return refused })
	})
	waitHeld(t, g)
	wg.Go(func() { second = g.Run(context.Background(), db, exec("a")) })
	waitQueued(t, g, 1)
	close(release)
	wg.Wait()
	if !errors.Is(first, refused) || second != nil {
		t.Errorf("Runs = %v, %v; want refused, nil", first, second)
	}
	wantLog(t, f, "BEGIN", "SAVEPOINT onceguard_member", "ROLLBACK TO onceguard_member", "RELEASE onceguard_member",
		"SAVEPOINT onceguard_member", "a", "RELEASE onceguard_member", "COMMIT")
}

// A failed COMMIT is every member's, the failed member's too.
func TestWriteGateFailedCommit(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	disk := errors.New("disk I/O error")
	f.failCommit = disk
	var told [][2]int
	g.OnCommit = func(members, waiting int) { told = append(told, [2]int{members, waiting}) }
	errs := grouped(t, g, f, db, exec("a"), func(context.Context, *sql.Tx) error { return errors.New("refused") })
	if len(told) != 1 || told[0] != [2]int{3, 0} {
		t.Errorf("OnCommit told %v; want once, the failed COMMIT's 3 members and 0 waiting", told)
	}
	for i, err := range errs {
		if !errors.Is(err, ErrGroupLost) || !errors.Is(err, disk) || !Unavailable(err) {
			t.Errorf("Run %d = %v (Unavailable %v); want ErrGroupLost, the COMMIT's error, Unavailable (nothing committed: a retry is safe)", i, err, Unavailable(err))
		}
	}
	f.failCommit = nil
	if err := g.Run(context.Background(), db, exec("after")); err != nil {
		t.Errorf("Run after a failed COMMIT = %v", err)
	}
}

// A member's panic is raised again in its own Run, after the group's
// COMMIT; its work is rolled back, the others commit and the gate goes
// on. So is the first's, alone.
func TestWriteGatePanic(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	errs := grouped(t, g, f, db, exec("a"), func(ctx context.Context, tx *sql.Tx) error {
		_ = exec("b")(ctx, tx)
		panic("boom")
	})
	if errs[0] != nil || errs[1] != nil || !isPanic(errs[2], "boom", "TestWriteGatePanic.func") {
		t.Errorf("Runs = %v; want nil, nil, the member's panic with its stack", errs)
	}
	log := f.lines()
	if i := slices.Index(log, "b"); i < 0 || log[i+1] != "ROLLBACK TO onceguard_member" {
		t.Errorf("the panicking member's work was not rolled back:\n%s", strings.Join(log, "\n"))
	}
	if c, r := slices.Index(log, "COMMIT"), slices.Index(log, "returned 2"); c < 0 || r < c {
		t.Errorf("the panicking member returned before the COMMIT:\n%s", strings.Join(log, "\n"))
	}
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_ = g.Run(context.Background(), db, func(context.Context, *sql.Tx) error { panic("alone") })
	}()
	if !isPanic(panicked{recovered}, "alone", "TestWriteGatePanic.func") {
		t.Errorf("Run's panic = %v; want the function's, raised again with its stack", recovered)
	}
	var failed error = &PanicError{Value: sql.ErrConnDone}
	if !errors.Is(failed, sql.ErrConnDone) {
		t.Errorf("a PanicError of an error does not unwrap to it")
	}
	if err := g.Run(context.Background(), db, exec("after")); err != nil {
		t.Errorf("Run after a panic = %v", err)
	}
}

// A Run gives up with its context while it is queued, and its function
// never runs; once taken, its statements run without the context's
// cancellation (SQLite interrupted in a statement rolls back the whole,
// shared, transaction) and it returns after the COMMIT, nil.
func TestWriteGateCancel(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	release := make(chan struct{})
	var wg sync.WaitGroup
	var first error
	wg.Go(func() {
		first = g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error { <-release; return nil })
	})
	waitHeld(t, g)
	gone, leave := context.WithCancel(context.Background())
	var left error
	wg.Go(func() {
		left = g.Run(gone, db, func(context.Context, *sql.Tx) error { t.Error("a Run that left the queue ran"); return nil })
	})
	waitQueued(t, g, 1)
	leave()
	waitQueued(t, g, 0)
	mine, cancel := context.WithCancel(context.Background())
	var inside, taken error
	wg.Go(func() {
		taken = g.Run(mine, db, func(ctx context.Context, tx *sql.Tx) error {
			cancel() // the caller gives up while its statements run
			inside = ctx.Err()
			return exec("a")(ctx, tx)
		})
	})
	waitQueued(t, g, 1)
	close(release)
	wg.Wait()
	if first != nil || !errors.Is(left, context.Canceled) || taken != nil || inside != nil {
		t.Errorf("first %v, left %v, taken %v, its ctx inside %v; want nil, Canceled, nil, nil", first, left, taken, inside)
	}
	wantLog(t, f, "BEGIN", "SAVEPOINT onceguard_member", "RELEASE onceguard_member",
		"SAVEPOINT onceguard_member", "a", "RELEASE onceguard_member", "COMMIT")

	// Already cancelled, on a free gate: nothing runs.
	if err := g.Run(gone, db, func(context.Context, *sql.Tx) error { t.Error("a cancelled Run ran"); return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context on a free gate = %v; want Canceled", err)
	}
}

// A BEGIN that fails (SQLITE_BUSY past the busy timeout, an I/O error)
// is the first Run's error, at once, and the gate goes on.
func TestWriteGateFailedBegin(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	locked := errors.New("database is locked")
	f.mu.Lock()
	f.failBegin = locked
	f.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background(), db, exec("a")) }()
	select {
	case err := <-done:
		if !errors.Is(err, locked) {
			t.Errorf("Run with a failing BEGIN = %v; want its error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run with a failing BEGIN never returned")
	}
	f.mu.Lock()
	f.failBegin = nil
	f.mu.Unlock()
	if err := g.Run(context.Background(), db, exec("after")); err != nil {
		t.Errorf("Run after a failed BEGIN = %v", err)
	}
	wantLog(t, f, "BEGIN failed", "BEGIN", "SAVEPOINT onceguard_member", "after", "RELEASE onceguard_member", "COMMIT")
}

// lateGiveUp is the context of a caller that gives up exactly as its turn
// comes: Err is nil for its first two calls (Run's entry, the gate's check
// as it hands the turn over) and Canceled from then on; Done never closes.
type lateGiveUp struct {
	context.Context
	calls atomic.Int32
}

func (c *lateGiveUp) Err() error {
	if c.calls.Add(1) <= 2 {
		return nil
	}
	return context.Canceled
}

func (c *lateGiveUp) Done() <-chan struct{} { return nil }

// A Run handed the gate's turn after its caller gave up returns the
// context's error and passes the turn on: the gate is not left held.
func TestWriteGateTurnGivenUp(t *testing.T) {
	_, db := newFake(t)
	g := NewWriteGate()
	g.MaxGroup = 1 // the queued Run gets the turn, not a place in the group
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = g.Run(context.Background(), db, func(context.Context, *sql.Tx) error { <-release; return nil })
	})
	waitHeld(t, g)
	var gaveUp error
	wg.Go(func() {
		gaveUp = g.Run(&lateGiveUp{Context: context.Background()}, db, func(context.Context, *sql.Tx) error {
			t.Error("the Run whose caller gave up ran")
			return nil
		})
	})
	waitQueued(t, g, 1)
	close(release)
	wg.Wait()
	if !errors.Is(gaveUp, context.Canceled) {
		t.Errorf("the Run that gave up as its turn came = %v; want Canceled", gaveUp)
	}
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background(), db, exec("after")) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after a given-up turn = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run after a given-up turn never ran: the gate stayed held")
	}
}

// A nil gate runs each transaction alone, at once, with its context.
func TestWriteGateNil(t *testing.T) {
	f, db := newFake(t)
	var g *WriteGate
	hold := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error { <-hold; return nil }); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	err := g.Run(ctx, db, func(ctx context.Context, tx *sql.Tx) error {
		cancel()
		if ctx.Err() == nil {
			t.Error("a nil gate's transaction did not get its caller's cancellation")
		}
		return nil
	})
	close(hold)
	wg.Wait()
	if err == nil {
		t.Error("a transaction whose context was cancelled committed")
	}
	_ = f
}

// A holder whose goroutine ends inside a member's function (runtime.Goexit)
// still answers the group it took, ErrGroupLost, and frees the gate.
func TestWriteGateHolderStops(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	release, firstDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(firstDone)
		_ = g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error { <-release; return exec("first")(ctx, tx) })
	}()
	waitHeld(t, g)
	done := make(chan error, 2)
	go func() { done <- g.Run(context.Background(), db, exec("second")) }()
	waitQueued(t, g, 1)
	go func() {
		done <- g.Run(context.Background(), db, func(context.Context, *sql.Tx) error { runtime.Goexit(); return nil })
	}()
	waitQueued(t, g, 2)
	close(release)
	<-firstDone
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, ErrGroupLost) {
				t.Errorf("Run = %v; want ErrGroupLost", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("a member of a group whose holder stopped was never answered; log %q", f.lines())
		}
	}
	if err := g.Run(context.Background(), db, exec("after")); err != nil {
		t.Errorf("Run after the holder stopped = %v", err)
	}
}

// A gate serves one database.
func TestWriteGateOneDatabase(t *testing.T) {
	_, db1 := newFake(t)
	_, db2 := newFake(t)
	g := NewWriteGate()
	if err := g.Run(context.Background(), db1, exec("a")); err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), db2, exec("b")); err == nil {
		t.Error("Run with a second database = nil; want an error")
	}
}

// A Run whose turn has come waits for a connection of the pool with its
// context: with every connection taken, it gives up at its deadline, and
// the gate goes on once one is back.
func TestWriteGateWaitsForConnWithContext(t *testing.T) {
	_, db := newFake(t)
	db.SetMaxOpenConns(1)
	g := NewWriteGate()
	c, err := db.Conn(context.Background()) // the pool's only one
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, db, exec("waits")) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run with no connection free = %v; want its deadline", err)
		}
	case <-time.After(10 * time.Second): // only bounds the hang of a Run that ignores its context
		t.Fatal("Run did not give up at its deadline while the pool had no connection")
	}
	c.Close()
	if err := g.Run(context.Background(), db, exec("after")); err != nil {
		t.Errorf("Run once the connection is back = %v", err)
	}
}

// With a watch (SQLiteWatch, here on the fake's named hook type), a group
// runs its members without savepoints and removes its hook when done.
func TestWriteGateBareGroup(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	g.Watch = SQLiteWatch
	errs := grouped(t, g, f, db, exec("a"), exec("b"))
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	log := f.lines()
	slices.Sort(log[len(log)-3:])
	want := []string{"BEGIN", "first", "a", "b", "COMMIT", "returned 0", "returned 1", "returned 2"}
	if !slices.Equal(log, want) {
		t.Errorf("the driver was asked:\n\t%s\nwant:\n\t%s", strings.Join(log, "\n\t"), strings.Join(want, "\n\t"))
	}
	if f.hook != nil {
		t.Error("the group left its rollback hook on the connection")
	}
}

// A bare member that fails with others' work in the transaction rolls it
// all back; the group runs again from its first member, each in a
// savepoint, and commits what did not fail. The group after it starts
// with savepoints, and the one after that bare again.
func TestWriteGateBareFailedMember(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	g.Watch = SQLiteWatch
	refused := errors.New("refused")
	var calls atomic.Int32
	errs := grouped(t, g, f, db, exec("a"), execThen("b", refused, &calls), exec("c"))
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || !errors.Is(errs[2], refused) {
		t.Errorf("Runs = %v; want nil, nil, refused, nil", errs)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the failed member's function ran %d times; want 2 (bare, then in its savepoint)", n)
	}
	sp, rel := "SAVEPOINT onceguard_member", "RELEASE onceguard_member"
	want := []string{"BEGIN", "first", "a", "b", "ROLLBACK", "BEGIN",
		sp, "first", rel, sp, "a", rel, sp, "b", "ROLLBACK TO onceguard_member", rel, sp, "c", rel, "COMMIT"}
	if log := f.lines(); len(log) < len(want) || !slices.Equal(log[:len(want)], want) {
		t.Errorf("the driver was asked:\n\t%s\nwant first:\n\t%s", strings.Join(log, "\n\t"), strings.Join(want, "\n\t"))
	}
	// The group after the failure: with savepoints; the one after it: bare.
	for _, want := range [][]string{{"BEGIN", sp, "next", rel, "COMMIT"}, {"BEGIN", "then", "COMMIT"}} {
		f.mu.Lock()
		f.log = nil
		f.mu.Unlock()
		if err := g.Run(context.Background(), db, exec(want[len(want)/2])); err != nil {
			t.Fatal(err)
		}
		wantLog(t, f, want...)
	}
}

// The first member failing bare, with nothing before it, is rolled back
// with the transaction and its failure stands: it does not run again, and
// the members after it still run bare.
func TestWriteGateBareFailedFirst(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	g.Watch = SQLiteWatch
	refused := errors.New("refused")
	release := make(chan struct{})
	var first, second error
	var calls atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		first = g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error {
			calls.Add(1)
			<-release
			if err := exec("x")(ctx, tx); err != nil {
				return err
			}
			return refused
		})
	})
	waitHeld(t, g)
	wg.Go(func() { second = g.Run(context.Background(), db, exec("a")) })
	waitQueued(t, g, 1)
	close(release)
	wg.Wait()
	if !errors.Is(first, refused) || second != nil || calls.Load() != 1 {
		t.Errorf("Runs = %v, %v, the first's function ran %d times; want refused, nil, once", first, second, calls.Load())
	}
	wantLog(t, f, "BEGIN", "x", "ROLLBACK", "BEGIN", "a", "COMMIT")
}

// A bare member whose statement made SQLite roll the whole transaction
// back, and which went on as if it had not, loses the group before any
// other member's statements run outside a transaction: every Run of the
// group returns ErrGroupLost, and the one queued behind it runs in a
// transaction of its own.
func TestWriteGateBareRolledBackWhole(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	g.Watch = SQLiteWatch
	errs := grouped(t, g, f, db, exec("a"), func(ctx context.Context, tx *sql.Tx) error {
		_, _ = tx.ExecContext(ctx, "disk full") // the error dropped: against Run's contract
		return nil
	}, exec("c"))
	for i, err := range errs[:3] {
		if !errors.Is(err, ErrGroupLost) {
			t.Errorf("Run %d = %v; want ErrGroupLost", i, err)
		}
	}
	if errs[3] != nil {
		t.Errorf("Run 3 = %v; want nil, in a group of its own", errs[3])
	}
	var stmts []string
	for _, l := range f.lines() {
		if !strings.HasPrefix(l, "returned") {
			stmts = append(stmts, l)
		}
	}
	if want := []string{"BEGIN", "first", "a", "disk full", "ROLLBACK", "BEGIN", "c", "COMMIT"}; !slices.Equal(stmts, want) {
		t.Errorf("the driver was asked:\n\t%s\nwant:\n\t%s", strings.Join(stmts, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// SQLiteWatch finds a connection's RegisterRollbackHook whatever its named
// func type, and reports ok false for a connection without one.
func TestSQLiteWatch(t *testing.T) {
	f := &fakeDB{}
	n := 0
	stop, ok := SQLiteWatch(fakeConn{f}, func() { n++ })
	if !ok {
		t.Fatal("SQLiteWatch did not find the fake's RegisterRollbackHook")
	}
	f.rolledBack()
	stop()
	f.rolledBack()
	if n != 1 || f.hook != nil {
		t.Errorf("the hook ran %d times (want 1: once before stop), left set %v", n, f.hook != nil)
	}
	if _, ok := SQLiteWatch(struct{}{}, func() {}); ok {
		t.Error("SQLiteWatch reported ok for a connection without a rollback hook")
	}
}

// A bare group whose member fails, with others' work in the transaction,
// rolls back and begins again; a BEGIN that fails then (SQLITE_BUSY past
// the busy timeout: a writer outside the gate took the lock the ROLLBACK
// freed, or an I/O error) loses the group: every Run returns
// ErrGroupLost, no Run panics, and the gate goes on.
func TestWriteGateBareRebeginFails(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	g.Watch = SQLiteWatch
	locked := errors.New("database is locked")
	refused := errors.New("refused")
	var holderPanic any
	errs := make([]error, 3)
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { holderPanic = recover() }()
		errs[0] = g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error {
			<-release
			return exec("first")(ctx, tx)
		})
	})
	waitHeld(t, g)
	wg.Go(func() { errs[1] = g.Run(context.Background(), db, exec("a")) })
	waitQueued(t, g, 1)
	wg.Go(func() {
		errs[2] = g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error {
			f.mu.Lock()
			f.failBegin = locked // the group's next BEGIN fails
			f.mu.Unlock()
			return execThen("b", refused, nil)(ctx, tx)
		})
	})
	waitQueued(t, g, 2)
	close(release)
	wg.Wait()
	if holderPanic != nil {
		t.Fatalf("the holder's Run panicked: %v\n%s", holderPanic, strings.Join(f.lines(), "\n"))
	}
	for i, err := range errs {
		if !errors.Is(err, ErrGroupLost) || !errors.Is(err, locked) {
			t.Errorf("Run %d = %v; want ErrGroupLost with the BEGIN's error", i, err)
		}
	}
	f.mu.Lock()
	f.failBegin = nil
	f.mu.Unlock()
	if err := g.Run(context.Background(), db, exec("after")); err != nil {
		t.Errorf("Run after the lost group = %v", err)
	}
}

// OnCommit that panics (a caller's metrics callback) after a COMMIT that
// succeeded must not tell the group's Runs ErrGroupLost, which says that
// nothing committed and a retry is safe.
func TestWriteGateOnCommitPanicAfterCommit(t *testing.T) {
	f, db := newFake(t)
	g := NewWriteGate()
	g.OnCommit = func(int, int) { panic("metrics") }
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { _ = recover() }() // the holder's Run: OnCommit's panic is its caller's
		_ = g.Run(context.Background(), db, func(ctx context.Context, tx *sql.Tx) error { <-release; return exec("first")(ctx, tx) })
	})
	waitHeld(t, g)
	var member error
	wg.Go(func() { member = g.Run(context.Background(), db, exec("a")) })
	waitQueued(t, g, 1)
	close(release)
	wg.Wait()
	if !slices.Contains(f.lines(), "COMMIT") {
		t.Fatalf("no COMMIT: %v", f.lines())
	}
	if member != nil {
		t.Errorf("a member of a group that committed = %v; want nil (ErrGroupLost says nothing committed)", member)
	}
}
