package pgnotify_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// failNotify is the pgx driver, except that every statement calling
// pg_notify fails: a NOTIFY that cannot be sent.
type failNotify struct{ driver.Connector }

func (f failNotify) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := f.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &failNotifyConn{c.(*stdlib.Conn)}, nil
}

type failNotifyConn struct{ *stdlib.Conn }

var errNotify = errors.New("injected: NOTIFY failed")

func (c *failNotifyConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if strings.Contains(q, "pg_notify") {
		return nil, errNotify
	}
	return c.Conn.ExecContext(ctx, q, args)
}

func (c *failNotifyConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	if strings.Contains(q, "pg_notify") {
		return nil, errNotify
	}
	return c.Conn.QueryContext(ctx, q, args)
}

// idle is a Listener that listens to nothing: the store sends NOTIFY
// because it has one.
type idle struct{}

func (idle) Listen(ctx context.Context, _ string, _ func(string)) (func() error, error) {
	return func() error { <-ctx.Done(); return nil }, nil
}

// Complete's NOTIFY is part of the completion: when it fails, Complete
// fails and nothing is stored; it never reports a failure for an answer
// it stored (Middleware would then free the key of a stored refusal,
// with its window, and answer 503 for what a retry replays).
func TestCompleteNotifyAtomic(t *testing.T) {
	dsn := os.Getenv("ONCEGUARD_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES is not set")
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(failNotify{stdlib.GetConnector(*cfg)})
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: idle{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	req := idemstore.BeginRequest{ID: fmt.Sprint("atomic-", time.Now().UnixNano()), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: time.Now()}
	res, err := s.Begin(ctx, req)
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin: %v %v", res, err)
	}
	cerr := s.Complete(ctx, req.ID, res.Lease, idemstore.Response{Status: 422, Body: []byte("refused")}, time.Now())
	req.Now = time.Now()
	again, err := s.Begin(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if cerr != nil && again.Outcome == idemstore.Replay {
		t.Errorf("Complete failed (%v), yet the answer is stored", cerr)
	}
	if cerr == nil && again.Outcome != idemstore.Replay {
		t.Errorf("Complete succeeded, yet the record is %v", again.Outcome)
	}
}
