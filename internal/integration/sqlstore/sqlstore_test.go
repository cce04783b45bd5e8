package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/pgbouncertest"
	"github.com/onceguard/onceguard/sqldialect"
)

type database struct {
	name    string
	dialect sqldialect.Dialect
	open    func(t *testing.T) *sql.DB
}

func openSQLite(t *testing.T) *sql.DB { return dbtest.SQLite(t) }

// store opens d and a Store on it (tables prefixed storetest_).
func (d database) store(t *testing.T) (*sqlstore.Store, *sql.DB) {
	t.Helper()
	db := d.open(t)
	s, err := sqlstore.New(db, d.dialect, &sqlstore.Options{Prefix: "storetest_"})
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

var databases = []database{
	{"postgres", sqldialect.Postgres, func(t *testing.T) *sql.DB { return dbtest.Postgres(t) }},
	{"mysql", sqldialect.MySQL, func(t *testing.T) *sql.DB { return dbtest.MySQL(t) }},
	{"sqlite", sqldialect.SQLite, openSQLite},
	// Behind PgBouncer in transaction pooling mode, with two server
	// connections for up to dbtest.MaxOpenConns clients (docs/pitfalls.md, item 9).
	{"postgres-pgbouncer", sqldialect.Postgres, func(t *testing.T) *sql.DB {
		return dbtest.OpenPostgres(t, pgbouncertest.Start(t, pgbouncertest.Config{Pool: 2}))
	}},
}

func TestStore(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			s, err := sqlstore.New(db, d.dialect, &sqlstore.Options{Prefix: "storetest_", PruneEvery: 50})
			if err != nil {
				t.Fatal(err)
			}
			storetest.Run(t, func(*testing.T) idemstore.FullStore { return s })
		})
	}
}

// The answer is stored in the business transaction: rolled back, the key
// is still in flight; committed, it replays.
func TestCompleteTx(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db := d.store(t)
			ctx, now := context.Background(), time.Now()
			id := idempotency.RecordID(idempotency.Scope{Principal: t.Name()}, now.String())
			res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
			if err != nil || res.Outcome != idemstore.Started {
				t.Fatalf("Begin = %+v, %v", res, err)
			}
			resp := idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`)}
			tx, _ := db.BeginTx(ctx, nil)
			if err := s.CompleteTx(ctx, tx, id, res.Lease, resp); err != nil {
				t.Fatalf("CompleteTx = %v", err)
			}
			_ = tx.Rollback()
			if got, _ := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}); got.Outcome != idemstore.InProgress {
				t.Errorf("after a rolled back CompleteTx: %v; want InProgress", got.Outcome)
			}
			tx, _ = db.BeginTx(ctx, nil)
			if err := s.CompleteTx(ctx, tx, id, res.Lease, resp); err != nil {
				t.Fatalf("CompleteTx = %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}); got.Outcome != idemstore.Replay {
				t.Errorf("after a committed CompleteTx: %v; want Replay", got.Outcome)
			}
			tx, _ = db.BeginTx(ctx, nil)
			defer tx.Rollback()
			if err := s.CompleteTx(ctx, tx, id, res.Lease, resp); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("CompleteTx of a completed record = %v; want ErrLeaseLost", err)
			}
		})
	}
}

func TestClosedDatabase(t *testing.T) {
	db := openSQLite(t)
	s, _ := sqlstore.New(db, sqldialect.SQLite, nil)
	_ = db.Close()
	_, err := s.Begin(context.Background(), idemstore.BeginRequest{ID: "x", Fingerprint: "f", Lease: time.Second, TTL: time.Hour, Now: time.Now()})
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Begin on a closed DB = %v; want ErrUnavailable", err)
	}
}
