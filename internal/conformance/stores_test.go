package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/idemgrpctest"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/sqldialect"
)

// store is one store the suite runs on.
type store struct {
	name string
	new  func(t *testing.T) func(t *testing.T) idemstore.FullStore
}

// sqlStore opens the database and a store on it (tables prefixed
// conformance_, kept between runs as storetest's are): the suite's keys
// and bodies are unique to each run.
func sqlStore(dialect sqldialect.Dialect, open func(testing.TB) *sql.DB) func(t *testing.T) func(t *testing.T) idemstore.FullStore {
	return func(t *testing.T) func(t *testing.T) idemstore.FullStore {
		s, err := sqlstore.New(open(t), dialect, &sqlstore.Options{Prefix: "conformance_"})
		if err != nil {
			t.Fatal(err)
		}
		return func(*testing.T) idemstore.FullStore { return s }
	}
}

var stores = []store{
	{"memory", func(*testing.T) func(*testing.T) idemstore.FullStore {
		return func(*testing.T) idemstore.FullStore { return &memstore.Store{} }
	}},
	{"redis", func(t *testing.T) func(*testing.T) idemstore.FullStore {
		rdb := redistest.Shared(t)
		prefix := redistest.Prefix(t, rdb, "conformance") // its keys are deleted when the test ends
		return func(*testing.T) idemstore.FullStore { return redisstore.New(rdb, &redisstore.Options{Prefix: prefix}) }
	}},
	{"postgres", sqlStore(sqldialect.Postgres, dbtest.Postgres)},
	{"mysql", sqlStore(sqldialect.MySQL, dbtest.MySQL)},
	{"sqlite", sqlStore(sqldialect.SQLite, dbtest.SQLite)},
}

// adapters are the adapters under test, each with its adaptertest.Start.
var adapters = []struct {
	name  string
	start adaptertest.Start
}{
	{"net/http", startNetHTTP},
}

func TestConformance(t *testing.T) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			for _, s := range stores {
				t.Run(s.name, func(t *testing.T) { adaptertest.Run(t, a.start, s.new(t)) })
			}
		})
	}
}

func principal(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }

func startNetHTTP(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	h := idempotency.Middleware(idempotency.Config{Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose,
		Window: cfg.Window, Lease: cfg.Lease, Principal: principal})(app)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = quiet
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// The gRPC interceptors' suite (its own: gRPC is not HTTP) on every
// store.
func TestGRPCConformance(t *testing.T) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			newStore := s.new(t)
			var servers atomic.Int64
			idemgrpctest.Run(t, func(t *testing.T) idemstore.Store {
				// The suite's keys are fixed ("k-replay"): each server gets
				// records of its own in the shared store.
				return namespaced{newStore(t), fmt.Sprintf("%d.%d/", time.Now().UnixNano(), servers.Add(1))}
			})
		})
	}
}

// namespaced gives a store's records and window entries a namespace of
// their own (ns before every id), so that suites whose keys are fixed run
// on one shared database. Tokens are random: they pass through.
type namespaced struct {
	idemstore.FullStore
	ns string
}

func (n namespaced) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	r.ID = n.ns + r.ID
	return n.FullStore.Begin(ctx, r)
}

func (n namespaced) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	return n.FullStore.Complete(ctx, n.ns+id, lease, resp, now)
}

func (n namespaced) Abandon(ctx context.Context, id, lease string) error {
	return n.FullStore.Abandon(ctx, n.ns+id, lease)
}

func (n namespaced) ClaimWindow(ctx context.Context, id, owner string, window time.Duration, now time.Time) (time.Duration, error) {
	return n.FullStore.ClaimWindow(ctx, n.ns+id, owner, window, now)
}

func (n namespaced) FreeWindow(ctx context.Context, id, owner string) error {
	return n.FullStore.FreeWindow(ctx, n.ns+id, owner)
}

func (n namespaced) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	w, ok := n.FullStore.(idemstore.Notifier)
	if !ok {
		return nil, nil, errors.New("conformance: the store does not notify")
	}
	return w.Watch(ctx, n.ns+id)
}
