package sqllock_test

import (
	"context"
	"testing"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/pgbouncertest"
	"github.com/onceguard/onceguard/lock/sqllock"
)

// The hazard the backends avoid, shown on the PgBouncer the other tests
// use (so that they prove something): in transaction pooling mode a
// session-scoped advisory lock stays on the server connection when the
// statement ends, and the next client given that connection holds it too.
func TestPgBouncerStrandsSessionLocks(t *testing.T) {
	db := dbtest.OpenPostgres(t, pgbouncertest.Start(t, pgbouncertest.Config{Pool: 1}))
	ctx := context.Background()
	key := sqllock.AdvisoryKey(t.Name())
	a, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var pidA, pidB int
	var gotA, gotB bool
	if err := a.QueryRowContext(ctx, `SELECT pg_backend_pid(), pg_try_advisory_lock($1)`, key).Scan(&pidA, &gotA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRowContext(ctx, `SELECT pg_backend_pid(), pg_try_advisory_lock($1)`, key).Scan(&pidB, &gotB); err != nil {
		t.Fatal(err)
	}
	if pidA != pidB || !gotA || !gotB {
		t.Fatalf("two clients: server pids %d and %d, lock taken %v and %v; "+
			"want one server connection, and both clients given the same session lock", pidA, pidB, gotA, gotB)
	}
}
