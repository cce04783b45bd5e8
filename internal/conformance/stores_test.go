package conformance_test

import (
	"database/sql"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
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
