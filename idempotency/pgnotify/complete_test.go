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

// CompleteRowsCTE completes, in the caller's statement, each record whose
// lease holds it, reads back their ids, and sends one NOTIFY for each
// record completed, none for a record it left in flight.
func TestCompleteRowsCTENotifies(t *testing.T) {
	dsn := os.Getenv("ONCEGUARD_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES is not set")
	}
	ctx := t.Context()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "pgnotify_", Listener: idle{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	listen, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listen.Close(context.Background()) })
	if _, err := listen.Exec(ctx, `LISTEN pgnotify_idempotency`); err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprint("rows-", time.Now().UnixNano())
	ids, leases := []string{run + "-a", run + "-b"}, []string{}
	for _, id := range ids {
		res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
		if err != nil || res.Outcome != idemstore.Started {
			t.Fatalf("Begin(%s): %v %v", id, res, err)
		}
		leases = append(leases, res.Lease)
	}
	status, header, body, err := sqlstore.CompleteRow(idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	cte, err := s.CompleteRowsCTE("r", 1)
	if err != nil {
		t.Fatal(err)
	}
	args := append(cte.Args, ids[0], leases[0], status, header, body, ids[1], "not its lease")
	n := len(cte.Args)
	q := fmt.Sprintf(`WITH r AS (
  SELECT * FROM (VALUES ($%d::text, $%d::text, $%d::int, $%d::text, $%d::bytea), ($%d::text, $%d::text, $%d::int, $%d::text, $%d::bytea)) AS r(rid, lease, status, header, body)
), %s
SELECT id FROM %s`, n+1, n+2, n+3, n+4, n+5, n+6, n+7, n+3, n+4, n+5, cte.With, cte.Result)
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		t.Fatal(err)
	}
	var done []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		done = append(done, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0] != ids[0] {
		t.Fatalf("completed %q; want only %q (the other's lease is not held)", done, ids[0])
	}
	for i, want := range []idemstore.Outcome{idemstore.Replay, idemstore.InProgress} {
		res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
		if err != nil || res.Outcome != want {
			t.Errorf("Begin(%s) after = %v, %v; want %v", ids[i], res.Outcome, err, want)
		}
		if want == idemstore.Replay && (res.Record == nil || res.Record.Response == nil || string(res.Record.Response.Body) != `{"ok":true}` || res.Record.Response.Status != 201 ||
			res.Record.Response.Header.Get("Content-Type") != "application/json") {
			t.Errorf("%s replays %+v; want the completed answer", ids[i], res.Record)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	note, err := listen.WaitForNotification(wctx)
	if err != nil || note.Payload != ids[0] {
		t.Fatalf("first NOTIFY = %+v, %v; want %q", note, err, ids[0])
	}
	wctx2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if note, err := listen.WaitForNotification(wctx2); err == nil && strings.HasPrefix(note.Payload, run) {
		t.Errorf("a NOTIFY for %q, which was not completed", note.Payload)
	}
}
