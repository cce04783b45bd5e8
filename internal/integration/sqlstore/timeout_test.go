package sqlstore_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/sqldialect"
)

// A call on a context without a deadline (Middleware's, after the
// handler) returns within Options.Timeout when the database stops
// answering, instead of waiting as long as the connection lives.
func TestTimeoutBoundsStalledDatabase(t *testing.T) {
	dsn := os.Getenv("ONCEGUARD_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set; skipping the integration test")
	}
	dsn, p := faultproxy.Front(t, dsn)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Prefix: "timeout_", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	res, err := s.Begin(ctx, idemstore.BeginRequest{ID: "stall-" + now.Format(time.RFC3339Nano), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	p.Blackhole()
	start := time.Now()
	err = s.Complete(ctx, "stall-"+now.Format(time.RFC3339Nano), res.Lease, idemstore.Response{Status: 201}, now)
	if took := time.Since(start); err == nil || took > 10*time.Second {
		t.Fatalf("Complete with the database black-holed = %v after %v; want an error within the 300ms timeout", err, took)
	}
	// Every other call made without a deadline is bounded too.
	for name, call := range map[string]func() error{
		"ClaimWindow": func() error { _, err := s.ClaimWindow(ctx, "w", "o", time.Second, now); return err },
		"Begin": func() error {
			_, err := s.Begin(ctx, idemstore.BeginRequest{ID: "stall-2", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
			return err
		},
		"Abandon":    func() error { return s.Abandon(ctx, "stall-"+now.Format(time.RFC3339Nano), res.Lease) },
		"FreeWindow": func() error { return s.FreeWindow(ctx, "w", "o") },
		"GetToken":   func() error { _, err := s.GetToken(ctx, "h"); return err },
	} {
		start = time.Now()
		if err := call(); err == nil || time.Since(start) > 10*time.Second {
			t.Errorf("%s with the database black-holed = %v after %v; want an error within the timeout", name, err, time.Since(start))
		}
	}
}
