package sqlstore_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/pgbouncertest"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

type database struct {
	name    string
	dialect sqldialect.Dialect
	open    func(t testing.TB) *sql.DB
}

var databases = []database{
	{"postgres", sqldialect.Postgres, dbtest.Postgres},
	{"mysql", sqldialect.MySQL, dbtest.MySQL},
	{"sqlite", sqldialect.SQLite, dbtest.SQLite},
	// Behind PgBouncer in transaction pooling mode, with four server
	// connections for the store's pool (PITFALLS 9: a session's advisory
	// lock is stranded there). Not fewer: TestSettleConcurrent holds one
	// transaction, waits in another, and watches them from a third.
	{"postgres-pgbouncer", sqldialect.Postgres, func(t testing.TB) *sql.DB {
		return dbtest.OpenPostgres(t, pgbouncertest.Start(t, pgbouncertest.Config{Pool: 4}))
	}},
}

var tables = []string{"outbox", "pending_movements", "service_secrets", "psp_events", "ledger", "payments", "orders", "withdrawals", "deposits", "accounts", "sessions", "users", "schema_migrations"}

// fresh drops the service's tables, so the test starts from nothing. The
// shared test databases hold no service data of anyone else.
func fresh(t *testing.T, db *sql.DB) {
	for _, tb := range tables {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
			t.Fatalf("drop %s: %v", tb, err)
		}
	}
}

// Two (here four) instances starting at once against one database must
// not break each other, and the constraints that keep money correct hold.
func TestMigrate(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			fresh(t, db)
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- sqlstore.Migrate(context.Background(), db, d.dialect)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("concurrent Migrate = %v", err)
				}
			}
			if err := sqlstore.Migrate(context.Background(), db, d.dialect); err != nil {
				t.Fatalf("Migrate again = %v", err)
			}
			var n int
			if err := db.QueryRow("SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n != sqlstore.Migrations(d.dialect) {
				t.Errorf("schema_migrations rows = %d, %v; want %d", n, err, sqlstore.Migrations(d.dialect))
			}
			constraints(t, db, d.dialect)
		})
	}
}

func constraints(t *testing.T, db *sql.DB, d sqldialect.Dialect) {
	q := func(s string) string {
		if d == sqldialect.Postgres {
			return sqldb.Rebind(s)
		}
		return s
	}
	now := time.Now().UnixMicro()
	mustExec := func(s string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q(s), args...); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	mustFail := func(what, s string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q(s), args...); err == nil {
			t.Errorf("%s: accepted; want the database to refuse it", what)
		}
	}
	mustExec(`INSERT INTO users (id, username, password_hash, created_at) VALUES ('u1', 'alice', 'h', ?)`, now)
	mustFail("a taken username", `INSERT INTO users (id, username, password_hash, created_at) VALUES ('u2', 'alice', 'h', ?)`, now)
	mustExec(`INSERT INTO accounts (user_id, balance, currency, version, updated_at) VALUES ('u1', 100, 'CNY', 0, ?)`, now)
	mustFail("a negative balance", `UPDATE accounts SET balance = balance - 101 WHERE user_id = 'u1'`)
	mustExec(`INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) VALUES ('w1', 'u1', 'k', 10, 'succeeded', ?)`, now)
	mustFail("a second withdrawal under one key", `INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) VALUES ('w2', 'u1', 'k', 10, 'succeeded', ?)`, now)
	// Two honest equal withdrawals in the same microsecond, with two keys.
	mustExec(`INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) VALUES ('w3', 'u1', 'k2', 10, 'succeeded', ?)`, now)
	mustFail("a zero amount", `INSERT INTO deposits (id, user_id, idempotency_key, amount, status, created_at) VALUES ('d0', 'u1', 'k0', 0, 'succeeded', ?)`, now)
	mustExec(`INSERT INTO orders (id, order_no, user_id, idempotency_key, amount, description, status, created_at) VALUES ('o1', 'N1', 'u1', 'k', 10, '', 'created', ?)`, now)
	mustExec(`INSERT INTO payments (id, order_id, user_id, idempotency_key, amount, status, paid_order_id, created_at) VALUES ('p1', 'o1', 'u1', 'k', 10, 'succeeded', 'o1', ?)`, now)
	mustExec(`INSERT INTO payments (id, order_id, user_id, idempotency_key, amount, status, paid_order_id, created_at) VALUES ('p2', 'o1', 'u1', 'k2', 10, 'failed', NULL, ?)`, now)
	mustFail("a second successful payment of an order", `INSERT INTO payments (id, order_id, user_id, idempotency_key, amount, status, paid_order_id, created_at) VALUES ('p3', 'o1', 'u1', 'k3', 10, 'succeeded', 'o1', ?)`, now)
	mustExec(`INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) VALUES ('u1', 'withdrawal', -10, 90, 'w1', ?)`, now)
	mustExec(`INSERT INTO psp_events (event_id, movement_id, status, received_at) VALUES ('evt_1', 'w1', 'succeeded', ?)`, now)
	mustFail("a provider event recorded twice", `INSERT INTO psp_events (event_id, movement_id, status, received_at) VALUES ('evt_1', 'w3', 'succeeded', ?)`, now)
	mustFail("a second ledger entry for one movement", `INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) VALUES ('u1', 'withdrawal', -10, 80, 'w1', ?)`, now)
}

// Two instances migrate at once on a PostgreSQL database whose default
// isolation is REPEATABLE READ: the second, once it has the lock, sees
// what the first applied (its transaction is READ COMMITTED whatever the
// default; under the default it failed with "relation users already exists").
func TestMigrateRepeatableRead(t *testing.T) {
	dsn := dbtest.FreshPostgres(t, "onceguard_migrate_rr")
	admin := dbtest.OpenPostgres(t, dsn)
	var name string
	if err := admin.QueryRow(`SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`ALTER DATABASE ` + name + ` SET default_transaction_isolation = 'repeatable read'`); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		fresh(t, admin)
		dbs := []*sql.DB{dbtest.OpenPostgres(t, dsn), dbtest.OpenPostgres(t, dsn)}
		errs := make([]error, len(dbs))
		var wg sync.WaitGroup
		for i, db := range dbs {
			wg.Go(func() { errs[i] = sqlstore.Migrate(context.Background(), db, sqldialect.Postgres) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, instance %d: Migrate = %v", round, i, err)
			}
		}
	}
}
