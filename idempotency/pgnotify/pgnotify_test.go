package pgnotify_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/pgnotify"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/onceguard/onceguard/sqldialect"
)

func open(t *testing.T) *sql.DB {
	dsn := os.Getenv("ONCEGUARD_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES is not set")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Bounded as internal/dbtest bounds its pools: the shared server's
	// connections are for every test package at once.
	db.SetMaxOpenConns(10)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// counting counts the store's Begins: a woken waiter asks again once,
// a polling one every 10..200 ms.
type counting struct {
	*sqlstore.Store
	begins atomic.Int32
}

func (c *counting) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	c.begins.Add(1)
	return c.Store.Begin(ctx, r)
}

// A retry that waits for the key's first request is woken by the NOTIFY
// of its completion, and replays its answer; without a Listener it polls.
func TestWaitWokenByNotify(t *testing.T) {
	db := open(t)
	for _, tc := range []struct {
		name      string
		listener  sqlstore.Listener
		maxBegins int32
	}{
		// The first Begin, the look right after the LISTEN, the
		// safety-net look after a second, the wake-up (and one more on a
		// slow machine).
		{"notified", pgnotify.Listener(db), 5},
		// Polling asks every 10, 20, 40, 80, 160, 200, 200 ... ms: more
		// than ten times in the 1.5 s the first request holds the key.
		{"polled", nil, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: tc.listener})
			if err != nil {
				t.Fatal(err)
			}
			store := &counting{Store: s}
			release := make(chan struct{})
			started := make(chan struct{})
			var runs atomic.Int32
			h := idempotency.Middleware(idempotency.Config{Store: store, Windows: s, Wait: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				close(started)
				<-release
				w.WriteHeader(201)
				_, _ = w.Write([]byte("paid"))
			}))
			key := fmt.Sprint("k", time.Now().UnixNano())
			send := func() *httptest.ResponseRecorder {
				r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`))
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- send() }()
			<-started
			waiter := make(chan *httptest.ResponseRecorder)
			before := store.begins.Load()
			go func() { waiter <- send() }()
			// The hold below starts once the waiter asked the store (found
			// the key in flight), not when its goroutine was started: on a
			// loaded machine that may be much later, and the polled case's
			// lower bound would fail.
			deadline := time.Now().Add(60 * time.Second)
			for store.begins.Load() == before && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(1500 * time.Millisecond)
			close(release)
			<-first
			var w *httptest.ResponseRecorder
			select {
			case w = <-waiter:
			case <-time.After(30 * time.Second):
				t.Fatal("the waiter was not answered within 30 s of the first answer")
			}
			if w.Code != 201 || w.Body.String() != "paid" || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("waiter: %d %q %v; want the first answer, replayed", w.Code, w.Body, w.Header())
			}
			begins := store.begins.Load() - before
			if begins > tc.maxBegins {
				t.Errorf("the waiter asked the store %d times; want at most %d", begins, tc.maxBegins)
			}
			if tc.listener == nil && begins < 8 {
				t.Errorf("polling asked only %d times in 1.5 s: the comparison shows nothing", begins)
			}
			if runs.Load() != 1 {
				t.Errorf("%d runs; want 1", runs.Load())
			}
			t.Logf("%s: %d Begins while waiting", tc.name, begins)
		})
	}
}

// The LISTEN connection is held only while someone waits.
func TestListenConnectionReleased(t *testing.T) {
	db := open(t)
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: pgnotify.Listener(db)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	listening := func() int {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %pgnotify_idempotency%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := listening()
	_, stop, err := s.Watch(t.Context(), "some-record")
	if err != nil {
		t.Fatal(err)
	}
	_, stop2, err := s.Watch(t.Context(), "another")
	if err != nil {
		t.Fatal(err)
	}
	if got := listening(); got != base+1 {
		t.Errorf("%d LISTEN connections while two watch; want %d (one shared)", got, base+1)
	}
	stop()
	stop2()
	deadline := time.Now().Add(10 * time.Second)
	for listening() != base && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := listening(); got != base {
		t.Errorf("%d LISTEN connections after the watchers stopped; want %d", got, base)
	}
}

// A Listener on another dialect is refused.
func TestListenerNeedsPostgres(t *testing.T) {
	if _, err := sqlstore.New(&sql.DB{}, sqldialect.MySQL, &sqlstore.Options{Listener: pgnotify.Listener(nil)}); err == nil {
		t.Error("New accepted a Listener on MySQL")
	}
}

// The store with a Listener passes the store suite, its Notifier case
// included (woken after Complete and after Abandon).
func TestStoreWithListener(t *testing.T) {
	db := open(t)
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: pgnotify.Listener(db)})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(*testing.T) idemstore.FullStore { return s })
}

// Watch honours its context while the LISTEN connection is being opened:
// with the pool exhausted (every connection busy), a waiting retry gives
// up when its wait (or its client) ends, instead of blocking until a
// connection frees, and a second watcher is not held behind the first.
func TestWatchPoolExhausted(t *testing.T) {
	db := open(t)
	db.SetMaxOpenConns(1)
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: pgnotify.Listener(db)})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := db.Conn(t.Context()) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	held := true
	free := func() {
		if held {
			held = false
			_ = busy.Close()
		}
	}
	defer free()
	done := make(chan error, 2)
	for _, id := range []string{"a", "b"} {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, stop, err := s.Watch(ctx, id)
			if err == nil {
				stop()
			}
			done <- err
		}()
	}
	for range 2 {
		select {
		case err := <-done:
			if err == nil {
				t.Error("Watch succeeded without a connection")
			}
		case <-time.After(30 * time.Second):
			free() // let it finish, to tell how it ended
			t.Fatal("Watch still blocked 30 s after its context ended, for as long as the pool is busy")
		}
	}
	free()
	// Once a connection is free, watching works again.
	_, stop, err := s.Watch(t.Context(), "c")
	if err != nil {
		t.Fatalf("Watch after the pool freed: %v", err)
	}
	stop()
}

// A LISTEN connection that breaks wakes every watcher (each asks the
// store again and watches anew, on a new LISTEN), watching then works
// again, and once nobody watches no goroutine is left behind.
func TestBrokenListenAndNoLeak(t *testing.T) {
	db := open(t)
	// A channel of its own: the connection this test cuts is no other
	// test's.
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_brk_", Listener: pgnotify.Listener(db)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	listening := func() int {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %pgnotify_brk_idempotency%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ignore := leakcheck.IgnoreCurrent()
	ch, stop, err := s.Watch(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %pgnotify_brk_idempotency%' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("a watcher was not woken when its LISTEN connection broke")
	}
	stop()

	// Watching again works: a Complete wakes it.
	id := fmt.Sprint("brk", time.Now().UnixNano())
	res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin: %v %v", res, err)
	}
	ch, stop, err = s.Watch(ctx, id)
	if err != nil {
		t.Fatalf("Watch after the broken LISTEN: %v", err)
	}
	if err := s.Complete(ctx, id, res.Lease, idemstore.Response{Status: 201}, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the new LISTEN did not wake its watcher")
	}
	stop()

	deadline := time.Now().Add(30 * time.Second)
	for listening() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := listening(); n != 0 {
		t.Fatalf("%d LISTEN connections after the watchers stopped", n)
	}
	if err := leakcheck.Find(ignore); err != nil {
		t.Error(err)
	}
}

// The LISTEN connection is not one of the pool's: with a pool of one
// connection, a waiting retry must not hold it while the first request
// needs it to store its answer. (On the pool, the first request's
// Complete timed out: its 201 was sent unstored and the key stayed in
// flight, so a retry after the lease would run the handler again; the
// waiter got 503.)
func TestListenOutsidePool(t *testing.T) {
	db := open(t)
	db.SetMaxOpenConns(1)
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: pgnotify.Listener(db), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	watch := open(t) // to look at the server without the pool under test
	listening := func() int {
		var n int
		if err := watch.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %pgnotify_idempotency%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := listening()
	release, started := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{Store: s, Wait: time.Minute, Lease: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		w.WriteHeader(201)
		_, _ = w.Write([]byte("paid"))
	}))
	key := fmt.Sprint("pool1-", time.Now().UnixNano())
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first, waiter := make(chan *httptest.ResponseRecorder, 1), make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send() }()
	<-started
	go func() { waiter <- send() }()
	deadline := time.Now().Add(30 * time.Second)
	for listening() == base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if listening() == base {
		t.Fatal("the waiter did not LISTEN within 30 s")
	}
	close(release)
	if w := <-first; w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	if w := <-waiter; w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("waiter: %d %q; want the replay of the 201", w.Code, w.Body)
	}
	if w := send(); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry afterwards: %d %q; want the replay: the first answer was stored", w.Code, w.Body)
	}
	if runs.Load() != 1 {
		t.Errorf("%d runs; want 1", runs.Load())
	}
}

// countListen counts the LISTEN connections opened.
type countListen struct {
	sqlstore.Listener
	n atomic.Int32
}

func (c *countListen) Listen(ctx context.Context, channel string, notify func(string)) (func() error, error) {
	c.n.Add(1)
	return c.Listener.Listen(ctx, channel, notify)
}

// A waiter woken by the NOTIFY of its key's answer replays it without
// opening another LISTEN first: a connection set up and torn down for
// nothing, on every waited request.
func TestWokenWaiterListensOnce(t *testing.T) {
	db := open(t)
	l := &countListen{Listener: pgnotify.Listener(db)}
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	store := &counting{Store: s}
	release, started := make(chan struct{}), make(chan struct{})
	h := idempotency.Middleware(idempotency.Config{Store: store, Wait: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(201)
	}))
	key := fmt.Sprint("once-", time.Now().UnixNano())
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first, waiter := make(chan *httptest.ResponseRecorder, 1), make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send() }()
	<-started
	before := store.begins.Load()
	go func() { waiter <- send() }()
	// Waiting: its first Begin, then the look right after the LISTEN.
	deadline := time.Now().Add(60 * time.Second)
	for store.begins.Load() < before+2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	<-first
	if w := <-waiter; w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("waiter: %d %v; want the replay", w.Code, w.Header())
	}
	if n := l.n.Load(); n != 1 {
		t.Errorf("%d LISTEN connections opened for one waited request; want 1", n)
	}
}

// A record completed by a caller's statement that composes CompleteManyCTE wakes its
// watchers, as Complete does: the NOTIFY is in the statement, sent at its commit.
func TestCompleteManyNotifies(t *testing.T) {
	db := open(t)
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: pgnotify.Listener(db)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint("many-", time.Now().UnixNano())
	res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	changed, stop, err := s.Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	status, header, body, err := sqlstore.ResponseColumns(idemstore.Response{Status: 201, Body: []byte("paid")})
	if err != nil {
		t.Fatal(err)
	}
	cte, err := s.CompleteManyCTE("mine", 6)
	if err != nil {
		t.Fatal(err)
	}
	if len(cte.Args) != 1 {
		t.Fatalf("CompleteManyCTE with a Listener has %d arguments; want its channel", len(cte.Args))
	}
	q := `WITH mine AS (SELECT $1::text AS id, $2::text AS lease, $3::int4 AS status, $4::text AS header, $5::bytea AS body), ` + cte.With + `
SELECT count(*) FROM ` + cte.Result
	var n int
	if err := db.QueryRowContext(ctx, q, id, res.Lease, int32(status), header, body, cte.Args[0]).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the composed statement completed %d, %v; want 1", n, err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher was not woken within 10 s of the completion")
	}
	if got, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: time.Now()}); err != nil || got.Outcome != idemstore.Replay || string(got.Record.Response.Body) != "paid" {
		t.Errorf("Begin after = %+v, %v; want the replay", got, err)
	}
}
