package sqlstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/sqldialect"
)

// A migration that fails on SQLite must leave nothing behind: its
// statements run in the BEGIN IMMEDIATE that serialises the migrators, and
// that transaction must be rolled back, not committed. Otherwise the
// statements before the failing one stay applied without their
// schema_migrations row, and every later start fails on them.
func TestMigrateSQLiteFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	// Something in the way of migration 001's last CREATE TABLE.
	if _, err := db.Exec(`CREATE TABLE ledger (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if err := sqlstore.Migrate(ctx, db, sqldialect.SQLite); err == nil {
		t.Fatal("Migrate with ledger in the way = nil; want an error")
	}
	if _, err := db.Exec(`DROP TABLE ledger`); err != nil {
		t.Fatal(err)
	}
	if err := sqlstore.Migrate(ctx, db, sqldialect.SQLite); err != nil {
		t.Fatalf("Migrate once the obstacle is gone = %v; want the failed migration to have left nothing", err)
	}
}

// MySQL's DDL is not transactional: a process that dies (or loses its
// connection, or is cancelled) between two statements of a migration
// leaves the first applied and no schema_migrations row. The next start
// must finish the migration rather than fail on what is already there.
func TestMigrateMySQLResumesHalfAppliedMigration(t *testing.T) {
	ctx := context.Background()
	db := dbtest.FreshPools(t, "mysql", "onceguard_migrate_half", 1)[0]
	for _, tc := range []struct {
		name    string
		version int
		undo    []string // the statements of the migration's tail, undone
	}{
		{"001: crash after some tables", 1, []string{`DROP TABLE ledger`}},
		{"002: crash after the first ALTER", 2, []string{`ALTER TABLE orders DROP COLUMN fence`}},
		{"003: crash after the first index", 3, []string{`DROP INDEX withdrawals_pending ON withdrawals`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fresh(t, db)
			if err := sqlstore.Migrate(ctx, db, sqldialect.MySQL); err != nil {
				t.Fatal(err)
			}
			// The crash: the tail of tc.version's statements not run, its
			// row not written. (For 001 the later migrations' rows go too:
			// a fresh database crashed in its first migration.)
			del := `DELETE FROM schema_migrations WHERE version = ?`
			if tc.version == 1 {
				del = `DELETE FROM schema_migrations WHERE version >= ?`
				for _, q := range []string{`DROP TABLE IF EXISTS outbox`, `DROP TABLE IF EXISTS service_secrets`, `DROP TABLE IF EXISTS psp_events`,
					`DROP INDEX deposits_pending ON deposits`, `DROP INDEX withdrawals_pending ON withdrawals`,
					`ALTER TABLE accounts DROP COLUMN fence`, `ALTER TABLE orders DROP COLUMN fence`} {
					if _, err := db.Exec(q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}
			if _, err := db.Exec(del, tc.version); err != nil {
				t.Fatal(err)
			}
			for _, q := range tc.undo {
				if _, err := db.Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if err := sqlstore.Migrate(ctx, db, sqldialect.MySQL); err != nil {
				t.Fatalf("Migrate after a crash in migration %d = %v; want it finished", tc.version, err)
			}
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n != sqlstore.Migrations(sqldialect.MySQL) {
				t.Errorf("schema_migrations rows = %d, %v; want %d", n, err, sqlstore.Migrations(sqldialect.MySQL))
			}
			constraints(t, db, sqldialect.MySQL)
		})
	}
}

// A database migrated by a newer version (a migration this binary does
// not know) is refused with a clear message: the older binary does not
// keep what the newer migrations added (docs/operations.md: "stop every
// instance of an earlier version", migration 008), so it must not start.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	for _, d := range databases[:3] {
		t.Run(d.name, func(t *testing.T) {
			db := dbtest.FreshPools(t, d.name, "onceguard_migrate_newer", 1)[0] // a database of its own
			if err := sqlstore.Migrate(ctx, db, d.dialect); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'x_999_future.sql', 0)`); err != nil {
				t.Fatal(err)
			}
			err := sqlstore.Migrate(ctx, db, d.dialect)
			if err == nil || !strings.Contains(err.Error(), "999") {
				t.Fatalf("Migrate on a database with migration 999 = %v; want it refused, naming the migration", err)
			}
		})
	}
}

// Five processes (five pools) migrate one fresh database at once.
func TestMigrateFivePools(t *testing.T) {
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(d, func(t *testing.T) {
			dialect := map[string]sqldialect.Dialect{"postgres": sqldialect.Postgres, "mysql": sqldialect.MySQL, "sqlite": sqldialect.SQLite}[d]
			dbs := dbtest.FreshPools(t, d, "onceguard_migrate_five", 5)
			errs := make(chan error, len(dbs))
			for _, db := range dbs {
				go func() { errs <- sqlstore.Migrate(context.Background(), db, dialect) }()
			}
			for range dbs {
				if err := <-errs; err != nil {
					t.Errorf("Migrate = %v", err)
				}
			}
			var n, distinct int
			if err := dbs[0].QueryRow(`SELECT count(*), count(DISTINCT version) FROM schema_migrations`).Scan(&n, &distinct); err != nil || n != sqlstore.Migrations(dialect) || distinct != n {
				t.Errorf("schema_migrations rows = %d (%d distinct), %v; want %d", n, distinct, err, sqlstore.Migrations(dialect))
			}
		})
	}
}
