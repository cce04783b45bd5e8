package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// faulty wraps a driver: while armed, a statement containing match fails
// as a dropped connection does (a reset by the peer).
type faulty struct {
	drv   driver.Driver
	dsn   string
	match string
	armed atomic.Bool
}

var errReset = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}

func (f *faulty) Connect(context.Context) (driver.Conn, error) {
	c, err := f.drv.Open(f.dsn)
	if err != nil {
		return nil, err
	}
	return &faultyConn{Conn: c, f: f}, nil
}
func (f *faulty) Driver() driver.Driver { return f.drv }

type faultyConn struct {
	driver.Conn
	f *faulty
}

func (c *faultyConn) fail(q string) bool { return c.f.armed.Load() && strings.Contains(q, c.f.match) }

func (c *faultyConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, o)
}
func (c *faultyConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if c.fail(q) {
		return nil, errReset
	}
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}
func (c *faultyConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	if c.fail(q) {
		return nil, errReset
	}
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}
func (c *faultyConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if c.fail(q) {
		return nil, errReset
	}
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

// A store that cannot answer says so (ErrUnavailable, as the Store
// interface and Do promise), at whichever statement of Begin the
// connection drops: a consumer redelivers on it instead of dead-lettering.
func TestBeginConnectionLostIsUnavailable(t *testing.T) {
	dsn := "file:" + filepath.Join(t.TempDir(), "test.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	probe, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	f := &faulty{drv: probe.Driver(), dsn: dsn, match: "SELECT fingerprint"}
	_ = probe.Close()
	db := sql.OpenDB(f)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, sqldialect.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	req := idemstore.BeginRequest{ID: "review-unavail", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}
	if res, err := s.Begin(ctx, req); err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	f.armed.Store(true) // the retry's Begin: its record exists, read under a lock
	_, err = s.Begin(ctx, req)
	if !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Begin with the connection lost = %v; want an error matching ErrUnavailable", err)
	}
}
