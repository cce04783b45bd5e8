package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/onceguard/onceguard/internal/testproc"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/pgbouncertest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m,
		// database/sql's connection opener lives as long as its *sql.DB;
		// tests close theirs, but the opener exits asynchronously.
		leakcheck.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// The goroutine that forks PgBouncer lives as long as the test binary.
		leakcheck.IgnoreTopFunction(testproc.SpawnerFunction))
}

type database struct {
	name    string
	dialect sqldialect.Dialect
	open    func(t *testing.T) *sql.DB
}

func openSQLite(t *testing.T) *sql.DB { return dbtest.SQLite(t) }

var databases = []database{
	{"postgres", sqldialect.Postgres, func(t *testing.T) *sql.DB { return dbtest.Postgres(t) }},
	{"mysql", sqldialect.MySQL, func(t *testing.T) *sql.DB { return dbtest.MySQL(t) }},
	{"sqlite", sqldialect.SQLite, openSQLite},
	// Behind PgBouncer in transaction pooling mode, with two server
	// connections for up to dbtest.MaxOpenConns clients (docs/pitfalls.md, item 9).
	{"postgres-pgbouncer", sqldialect.Postgres, func(t *testing.T) *sql.DB {
		return dbtest.OpenPostgres(t, pgbouncertest.Start(t, pgbouncertest.Config{Pool: 2}))
	}},
}

func TestConformance(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			b, err := sqllock.New(db, d.dialect, &sqllock.Options{Table: "locktest_locks"})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Migrate(context.Background()); err != nil {
				t.Fatalf("Migrate = %v", err)
			}
			locktest.Run(t, func(*testing.T) lock.Backend { return b },
				// Per-connection goroutines of drivers, started as the pool grows.
				"github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1",
				"github.com/jackc/pgx/v5/pgconn/ctxwatch.(*ContextWatcher).Watch.func1",
				"database/sql.(*DB).connectionOpener",
				// pgx starts a connection's background reader when a write
				// takes over 15ms (a loaded machine); it stays in Read on
				// the idle pooled connection after its query is done.
				"github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead")
		})
	}
}

// Two processes migrating at once must not break each other.
func TestMigrateConcurrently(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			table := "locktest_migrate_" + strings.ReplaceAll(d.name, "-", "_")
			_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					b, err := sqllock.New(db, d.dialect, &sqllock.Options{Table: table})
					if err == nil {
						err = b.Migrate(context.Background())
					}
					errs <- err
				}()
			}
			for range 4 {
				if err := <-errs; err != nil {
					t.Errorf("concurrent Migrate = %v; want nil", err)
				}
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	db := openSQLite(t)
	for _, tc := range []struct {
		name string
		db   *sql.DB
		d    sqldialect.Dialect
		opts *sqllock.Options
	}{
		{"nil db", nil, sqldialect.SQLite, nil},
		{"unknown dialect", db, sqldialect.Dialect(42), nil},
		{"bad table name", db, sqldialect.SQLite, &sqllock.Options{Table: "locks; DROP TABLE x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if b, err := sqllock.New(tc.db, tc.d, tc.opts); err == nil {
				t.Errorf("New = %v, nil; want an error", b)
			}
		})
	}
}

// A closed *sql.DB, or a database that goes away under a renewing lease,
// gives ErrUnavailable and a lease that ends at its deadline: never a panic,
// never a lock held forever.
func TestDatabaseGoesAway(t *testing.T) {
	db := openSQLite(t)
	backend, err := sqllock.New(db, sqldialect.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := lock.New(backend, &lock.Options{AutoRenew: true})
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, "gone", 300*time.Millisecond)
	if err != nil {
		t.Fatalf("TryAcquire = %v", err)
	}
	_ = db.Close()
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease still held 10s after its database closed; want it ended at its deadline")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("lease Err = %v; want ErrLost", err)
	}
	if _, err := l.TryAcquire(ctx, "other", time.Second); !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("TryAcquire on a closed DB = %v; want ErrUnavailable", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("Release on a closed DB = %v; want ErrUnavailable", err)
	}
}

// Rows idle past Retention are removed by later acquires.
func TestCleanup(t *testing.T) {
	db := openSQLite(t)
	backend, err := sqllock.New(db, sqldialect.SQLite, &sqllock.Options{Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := lock.New(backend, nil)
	ctx := context.Background()
	for i := range 600 {
		lease, err := l.TryAcquire(ctx, "k"+strings.Repeat("x", i%50)+string(rune('a'+i%26)), time.Millisecond)
		if err != nil {
			continue // a key still held from an earlier iteration
		}
		_ = lease.Release(ctx)
	}
	time.Sleep(5 * time.Millisecond)
	for range 300 {
		if lease, err := l.TryAcquire(ctx, "last", time.Millisecond); err == nil {
			_ = lease.Release(ctx)
		}
		time.Sleep(10 * time.Microsecond)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM onceguard_locks").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 60 {
		t.Errorf("%d rows left; want idle rows cleaned up (at most the recent few)", n)
	}
}

// XactBackend, also behind PgBouncer in transaction pooling mode: a held
// lock is an open transaction, which PgBouncer keeps on one server
// connection, so the pool needs a server connection per lock held at once
// (the conformance suite holds up to a few at once).
func TestConformanceXact(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) *sql.DB{
		"postgres": func(t *testing.T) *sql.DB {
			db := dbtest.Postgres(t)
			db.SetMaxOpenConns(64)
			return db
		},
		"postgres-pgbouncer": func(t *testing.T) *sql.DB {
			return dbtest.OpenPostgres(t, pgbouncertest.Start(t, pgbouncertest.Config{Pool: 8}))
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := sqllock.NewXact(open(t))
			if err != nil {
				t.Fatal(err)
			}
			locktest.Run(t, func(*testing.T) lock.Backend { return b },
				"github.com/jackc/pgx/v5/pgconn/ctxwatch.(*ContextWatcher).Watch.func1",
				"database/sql.(*DB).connectionOpener",
				"database/sql.(*Tx).awaitDone",
				// pgx reads a connection in the background while a cancelled
				// query's connection is being recovered, as the pool grows.
				"github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead")
		})
	}
}

// The server enforces the TTL: a holder that goes quiet loses the lock
// when PostgreSQL ends its idle session, without any client action.
func TestXactServerTTL(t *testing.T) {
	for _, d := range databases {
		if d.dialect == sqldialect.Postgres {
			t.Run(d.name, func(t *testing.T) { testXactServerTTL(t, d.open(t)) })
		}
	}
}

func testXactServerTTL(t *testing.T, db *sql.DB) {
	b, _ := sqllock.NewXact(db)
	l := lock.New(b, nil)
	ctx := context.Background()
	key := "xact-ttl-" + time.Now().String()
	lease, err := l.TryAcquire(ctx, key, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// Another pool, as another process would have.
	other := dbtest.Postgres(t)
	var got bool
	if err := other.QueryRow(`SELECT pg_try_advisory_lock($1)`, sqllock.AdvisoryKey(key)).Scan(&got); err != nil || got {
		t.Fatalf("another session took the held lock: %v, %v; want refused", got, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := other.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, sqllock.AdvisoryKey(key)).Scan(&got)
		if got {
			_, _ = conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, sqllock.AdvisoryKey(key))
		}
		_ = conn.Close()
		if err == nil && got {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lock still held 20s after a 300ms TTL; want the server to end the idle session")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrExpired) {
		t.Errorf("Release after the server ended the session = %v; want ErrExpired", err)
	}
}

// A lock row's fence only goes up, even when the clock is behind it (a
// row whose fence was raised past the clock: another backend's fences
// carried over, or a clock that stepped back): the next acquire's fence
// is above the stored one, on every dialect.
func TestFenceAboveStored(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			table := fmt.Sprintf("locktest_fence_%d", time.Now().UnixNano()%1_000_000)
			backend, err := sqllock.New(db, d.dialect, &sqllock.Options{Table: table})
			if err != nil {
				t.Fatal(err)
			}
			l := lock.New(backend, nil)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + table) })
			ctx := context.Background()
			first, err := l.TryAcquire(ctx, "k", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = first.Release(ctx)
			ahead := time.Now().Add(24*time.Hour).UnixMicro() + 1_000_000 // past every clock fence for a day
			q := "UPDATE " + table + " SET fence = ? WHERE name = ?"
			if d.dialect == sqldialect.Postgres {
				q = "UPDATE " + table + " SET fence = $1 WHERE name = $2"
			}
			if res, err := db.ExecContext(ctx, q, ahead, []byte("k")); err != nil {
				t.Fatal(err)
			} else if n, _ := res.RowsAffected(); n != 1 {
				t.Fatalf("raised %d rows; want the lock's one", n)
			}
			next, err := l.TryAcquire(ctx, "k", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Release(ctx)
			if next.Fence() <= ahead {
				t.Errorf("fence %d after the row's %d; want above it", next.Fence(), ahead)
			}
		})
	}
}
