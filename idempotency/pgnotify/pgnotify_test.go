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
