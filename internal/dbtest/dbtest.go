// Package dbtest opens the databases integration tests run against:
// PostgreSQL and MySQL/MariaDB named by ONCEGUARD_TEST_POSTGRES and
// ONCEGUARD_TEST_MYSQL (a test skips when its variable is unset), and a
// fresh SQLite file in the test's temp dir (always available: the driver
// is pure Go). It registers the pgx, mysql and sqlite drivers.
package dbtest

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/go-sql-driver/mysql" // driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "modernc.org/sqlite"             // driver "sqlite"
)

// MaxOpenConns bounds each pool: the servers' connection limits are shared
// by every test package running at once.
const MaxOpenConns = 32

// Postgres opens ONCEGUARD_TEST_POSTGRES, or skips.
func Postgres(t testing.TB) *sql.DB { return fromEnv(t, "pgx", "ONCEGUARD_TEST_POSTGRES") }

// MySQL opens ONCEGUARD_TEST_MYSQL, or skips.
func MySQL(t testing.TB) *sql.DB { return fromEnv(t, "mysql", "ONCEGUARD_TEST_MYSQL") }

func fromEnv(t testing.TB, driver, env string) *sql.DB {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		t.Skipf("%s not set; skipping the integration test", env)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("sql.Open(%s, %s) = %v", driver, env, err)
	}
	db.SetMaxOpenConns(MaxOpenConns)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("ping %s = %v; want the database answering", env, err)
	}
	return db
}

// SQLite opens a new SQLite file in t's temp dir with WAL and a busy
// timeout, as the packages' documentation recommends.
func SQLite(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		t.Fatalf("sql.Open(sqlite) = %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
