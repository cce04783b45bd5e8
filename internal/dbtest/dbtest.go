// Package dbtest opens the databases integration tests run against:
// PostgreSQL and MySQL/MariaDB named by ONCEGUARD_TEST_POSTGRES and
// ONCEGUARD_TEST_MYSQL (a test skips when its variable is unset), and a
// fresh SQLite file in the test's temp dir (always available: the driver
// is pure Go). It registers the pgx, mysql and sqlite drivers.
package dbtest

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	return open(t, driver, dsn, env)
}

// OpenPostgres opens the PostgreSQL URL dsn with pgx (a PgBouncer's, say,
// from internal/pgbouncertest), bounded as Postgres is.
func OpenPostgres(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	return open(t, "pgx", dsn, dsn)
}

// open opens dsn (named name in failures) with driver, pings it, and
// closes it when t ends.
func open(t testing.TB, driver, dsn, name string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("sql.Open(%s, %s) = %v", driver, name, err)
	}
	db.SetMaxOpenConns(MaxOpenConns)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("ping %s = %v; want the database answering", name, err)
	}
	return db
}

// SQLite opens a new SQLite file in t's temp dir with WAL and a busy
// timeout, as the packages' documentation recommends.
func SQLite(t testing.TB) *sql.DB {
	t.Helper()
	return OpenSQLite(t, func(path string) string {
		return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	})
}

// OpenSQLite opens a new SQLite file in t's temp dir with the DSN dsn
// makes of its path, and closes it when t ends, once its last
// connection is closed.
func OpenSQLite(t testing.TB, dsn func(path string) string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", dsn(filepath.Join(t.TempDir(), "test.db")))
	if err != nil {
		t.Fatalf("sql.Open(sqlite) = %v", err)
	}
	t.Cleanup(func() { closeSQLite(t, db) })
	return db
}

// closeSQLite closes db and waits until its last connection is closed:
// database/sql closes a connection in use when it is given back, after
// Close returns (one preparing a statement in the background, say), and
// SQLite's last close of the file writes beside it (its WAL checkpoint,
// the -wal and -shm files), which would race the removal of t's temp dir.
func closeSQLite(t testing.TB, db *sql.DB) {
	_ = db.Close()
	for deadline := time.Now().Add(10 * time.Second); db.Stats().OpenConnections > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("SQLite: %d connections still open 10 s after Close", db.Stats().OpenConnections)
			return
		}
	}
}

// FreshPostgres creates (or re-creates) a database for name on the server
// of ONCEGUARD_TEST_POSTGRES, or skips, returns its URL, and drops it when
// the test ends. Tests that own tables with common names (users,
// accounts, ...) use their own database, so that packages running at once
// do not meet; the name gets this process's id, so that two test runs at
// once (a developer's and CI's) do not drop each other's.
func FreshPostgres(t testing.TB, name string) string {
	t.Helper()
	admin := Postgres(t)
	name = processName(name)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`) })
	if _, err := admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`); err != nil {
		t.Fatalf("drop database %s: %v", name, err)
	}
	if _, err := admin.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	u, err := url.Parse(os.Getenv("ONCEGUARD_TEST_POSTGRES"))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// FreshMySQL is FreshPostgres for ONCEGUARD_TEST_MYSQL; it returns a
// go-sql-driver/mysql DSN.
func FreshMySQL(t testing.TB, name string) string {
	t.Helper()
	admin := MySQL(t)
	name = processName(name)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP DATABASE IF EXISTS ` + name) })
	for _, q := range []string{`DROP DATABASE IF EXISTS ` + name, `CREATE DATABASE ` + name} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	dsn := os.Getenv("ONCEGUARD_TEST_MYSQL")
	slash := strings.LastIndex(dsn, "/")
	rest := ""
	if q := strings.Index(dsn[slash:], "?"); q >= 0 {
		rest = dsn[slash+q:]
	}
	return dsn[:slash+1] + name + rest
}

// FreshPools creates a fresh database of kind ("postgres" or "mysql", as
// FreshPostgres and FreshMySQL, skipping without their variable, or
// "sqlite", a file in t's temp dir) for name, and opens n pools on it, as
// n processes would.
func FreshPools(t testing.TB, kind, name string, n int) []*sql.DB {
	t.Helper()
	var openOne func() *sql.DB
	switch kind {
	case "postgres":
		dsn := FreshPostgres(t, name)
		openOne = func() *sql.DB { return open(t, "pgx", dsn, dsn) }
	case "mysql":
		dsn := FreshMySQL(t, name)
		openOne = func() *sql.DB { return open(t, "mysql", dsn, name) }
	case "sqlite":
		path := filepath.Join(t.TempDir(), name+".db")
		openOne = func() *sql.DB {
			return OpenSQLite(t, func(string) string {
				return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
			})
		}
	default:
		t.Fatalf("dbtest: no database kind %q", kind)
	}
	dbs := make([]*sql.DB, n)
	for i := range dbs {
		dbs[i] = openOne()
	}
	return dbs
}

// processName is name with this process's id, within the 63 bytes a
// PostgreSQL or MySQL database name may have.
func processName(name string) string {
	suffix := fmt.Sprintf("_p%d", os.Getpid())
	if len(name)+len(suffix) > 63 {
		name = name[:63-len(suffix)]
	}
	return name + suffix
}

// Strings returns the one text column of rows, a query's result with its
// error err, in the rows' order; any error fails t.
func Strings(t testing.TB, rows *sql.Rows, err error) []string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
