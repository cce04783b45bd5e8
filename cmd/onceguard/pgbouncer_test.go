package main

import (
	"context"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/pgbouncertest"
)

// The service behind PgBouncer in transaction pooling mode (PITFALLS 9),
// with two server connections for its pool: PgBouncer refuses the session
// settings the service sends at connect (or, told to ignore them, drops
// them), so the service needs them on the database and says so; with them
// there, two instances end to end and the storms move money exactly once.
func TestServeBehindPgBouncer(t *testing.T) {
	dbURL := dbtest.FreshPostgres(t, "onceguard_e2e_pgbouncer")
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")

	// Without the database's own settings: refused at start, with what to run.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--db", pgbouncertest.Start(t, pgbouncertest.Config{Pool: 2, Database: name})},
		func(string) string { return "" }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ALTER DATABASE") || !strings.Contains(err.Error(), "SET lock_timeout = '10000ms'") {
		t.Fatalf("serve behind PgBouncer without the database's settings = %v; want a refusal naming ALTER DATABASE ... SET lock_timeout = '10000ms'", err)
	}

	// A PgBouncer that accepts the settings and drops them: refused too.
	err = run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--db", pgbouncertest.Start(t, pgbouncertest.Config{Pool: 2, Database: name,
		IgnoreStartupParameters: []string{"lock_timeout", "idle_in_transaction_session_timeout", "plan_cache_mode"}})},
		func(string) string { return "" }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not in effect") || !strings.Contains(err.Error(), "ALTER DATABASE") {
		t.Fatalf("serve behind a PgBouncer that drops the settings = %v; want a refusal naming ALTER DATABASE", err)
	}

	admin := dbtest.OpenPostgres(t, dbURL)
	for _, q := range []string{
		`ALTER DATABASE ` + name + ` SET lock_timeout = '10000ms'`,
		`ALTER DATABASE ` + name + ` SET idle_in_transaction_session_timeout = '10000ms'`,
	} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	// A new PgBouncer: its server connections log in with the settings.
	bouncer := pgbouncertest.Start(t, pgbouncertest.Config{Pool: 2, Database: name})
	bases := []string{startServe(t, "--db", bouncer), startServe(t, "--db", bouncer)}
	testServe(t, bases[0])
	stormSuite(t, bases)
}
