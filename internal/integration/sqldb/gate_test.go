// Package sqldb_test runs internal/sqldb's WriteGate on SQLite itself
// (modernc.org/sqlite, the service's driver): what a group of
// transactions commits when one of them fails, when the COMMIT fails, and
// when a caller gives up while its statements run.
package sqldb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/sqldb"
)

// open opens a new database as the service opens its own (sqldb.SQLiteDSN),
// with foreign keys on and a table whose foreign key is checked at COMMIT.
func open(t *testing.T) *sql.DB {
	t.Helper()
	db := dbtest.OpenSQLite(t, func(path string) string { return sqldb.SQLiteDSN(path) + "&_pragma=foreign_keys(1)" })
	db.SetMaxOpenConns(4)
	if _, err := db.Exec(`CREATE TABLE parent (id INTEGER PRIMARY KEY);
CREATE TABLE rows (name TEXT PRIMARY KEY, parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	return db
}

func insert(name string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO rows (name) VALUES (?)`, name)
		return err
	}
}

func names(t *testing.T, db *sql.DB) map[string]bool {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM rows`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		got[n] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// gates runs test with each kind of gate: members in savepoints, and
// bare (Watch: SQLiteWatch, the service's), with savepoints only once
// one fails.
func gates(t *testing.T, test func(t *testing.T, newGate func() *sqldb.WriteGate)) {
	t.Run("savepoints", func(t *testing.T) { test(t, sqldb.NewWriteGate) })
	t.Run("bare", func(t *testing.T) {
		test(t, func() *sqldb.WriteGate {
			g := sqldb.NewWriteGate()
			g.Watch = sqldb.SQLiteWatch
			return g
		})
	})
}

// group runs fns as one group: the first holds the gate until the others
// are queued behind it, in fns' order. It returns each Run's error.
func group(t *testing.T, g *sqldb.WriteGate, db *sql.DB, fns ...func(context.Context, *sql.Tx) error) []error {
	t.Helper()
	return groupCtx(t, g, db, make([]context.Context, len(fns)), fns...)
}

// groupCtx is group with each Run's context (nil: Background).
func groupCtx(t *testing.T, g *sqldb.WriteGate, db *sql.DB, ctxs []context.Context, fns ...func(context.Context, *sql.Tx) error) []error {
	t.Helper()
	for i := range ctxs {
		if ctxs[i] == nil {
			ctxs[i] = context.Background()
		}
	}
	errs := make([]error, len(fns))
	held, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var holding sync.Once // a group's functions may run twice (WriteGate.Watch)
	wg.Go(func() {
		errs[0] = g.Run(ctxs[0], db, func(ctx context.Context, tx *sql.Tx) error {
			holding.Do(func() { close(held) })
			<-release
			return fns[0](ctx, tx)
		})
	})
	<-held
	for i, fn := range fns[1:] {
		wg.Go(func() { errs[i+1] = g.Run(ctxs[i+1], db, fn) })
		for deadline := time.Now().Add(10 * time.Second); g.Waiting() != i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d Runs queued; want %d", g.Waiting(), i+1)
			}
		}
	}
	close(release)
	wg.Wait()
	return errs
}

// A member that wrote and then failed leaves nothing; the rest of its
// group commits, and a member sees the work of those before it, as if
// they had committed one after another.
func TestGroupFailedMember(t *testing.T) {
	gates(t, func(t *testing.T, newGate func() *sqldb.WriteGate) {
		db := open(t)
		g := newGate()
		refused := errors.New("refused")
		var seen int
		errs := group(t, g, db,
			insert("a"),
			func(ctx context.Context, tx *sql.Tx) error {
				if err := insert("b")(ctx, tx); err != nil {
					return err
				}
				return refused
			},
			insert("a"), // a duplicate of the first's, uncommitted yet
			func(ctx context.Context, tx *sql.Tx) error {
				if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM rows`).Scan(&seen); err != nil {
					return err
				}
				return insert("c")(ctx, tx)
			})
		if errs[0] != nil || !errors.Is(errs[1], refused) || errs[2] == nil || errs[3] != nil {
			t.Errorf("Runs = %v; want nil, refused, a UNIQUE failure, nil", errs)
		}
		if got := names(t, db); len(got) != 2 || !got["a"] || !got["c"] {
			t.Errorf("committed %v; want a and c", got)
		}
		if seen != 1 {
			t.Errorf("the last member saw %d rows; want 1 (the first's, not the failed member's)", seen)
		}
	})
}

// A COMMIT that fails (a deferred foreign key, checked at COMMIT) fails
// every member and commits nothing; the database takes the next
// transaction as before.
func TestGroupFailedCommit(t *testing.T) {
	gates(t, func(t *testing.T, newGate func() *sqldb.WriteGate) {
		db := open(t)
		g := newGate()
		errs := group(t, g, db, insert("a"), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO rows (name, parent) VALUES ('orphan', 7)`)
			return err
		}, insert("b"))
		for i, err := range errs {
			if !errors.Is(err, sqldb.ErrGroupLost) {
				t.Errorf("Run %d = %v; want ErrGroupLost", i, err)
			}
		}
		if got := names(t, db); len(got) != 0 {
			t.Errorf("committed %v after a failed COMMIT; want nothing", got)
		}
		for i := range 8 { // on every connection of the pool, in turn
			if err := g.Run(context.Background(), db, insert(fmt.Sprint("after", i))); err != nil {
				t.Fatalf("Run %d after a failed COMMIT = %v", i, err)
			}
		}
		if got := names(t, db); len(got) != 8 {
			t.Errorf("committed %v; want the eight after", got)
		}
	})
}

// A caller that gives up while its statements run in a group does not
// interrupt them (SQLite would roll back the whole transaction): the
// group commits, its own work with it, and its Run says so. The first's
// caller giving up while the group runs changes nothing either.
func TestGroupCancelledMember(t *testing.T) {
	gates(t, func(t *testing.T, newGate func() *sqldb.WriteGate) {
		db := open(t)
		g := newGate()
		firstCtx, cancelFirst := context.WithCancel(context.Background())
		memberCtx, cancelMember := context.WithCancel(context.Background())
		errs := groupCtx(t, g, db, []context.Context{firstCtx, memberCtx, nil},
			insert("a"),
			func(ctx context.Context, tx *sql.Tx) error {
				cancelFirst()
				cancelMember()
				for i := range 50 { // statements after both callers left
					if err := insert(fmt.Sprint("m", i))(ctx, tx); err != nil {
						return err
					}
				}
				return nil
			},
			insert("c"))
		for i, err := range errs {
			if err != nil {
				t.Errorf("Run %d = %v; want nil: it committed", i, err)
			}
		}
		if got := names(t, db); len(got) != 52 {
			t.Errorf("committed %d rows; want 52 (a, c and the member's 50)", len(got))
		}
	})
}

// Every connection SQLiteDSN opens has its settings: temporary files in
// memory (a member's savepoint journal is not written to a file past 64
// KiB), the 10 s busy timeout (a write outside the gate waits for the
// gate's transaction instead of failing with SQLITE_BUSY), WAL,
// synchronous NORMAL and the automatic checkpoint at 10000 pages.
func TestSQLiteDSNPragmas(t *testing.T) {
	db := open(t)
	conns := make([]*sql.Conn, 0, 4)
	for range 4 { // every connection of the pool has them
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for _, c := range conns {
		for _, p := range []struct{ pragma, want string }{
			{"temp_store", "2"}, // MEMORY
			{"busy_timeout", "10000"},
			{"journal_mode", "wal"},
			{"synchronous", "1"}, // NORMAL
			{"wal_autocheckpoint", "10000"},
		} {
			var got string
			if err := c.QueryRowContext(context.Background(), `PRAGMA `+p.pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != p.want {
				t.Errorf("PRAGMA %s = %s; want %s", p.pragma, got, p.want)
			}
		}
	}
}

// A function that lets SQLite roll the whole transaction back (its own
// short deadline interrupts a statement) and ignores the error loses its
// group, and its Run says so: the first of a group runs in a savepoint
// too, whose RELEASE finds the transaction gone. The next member's
// statements must not run outside a transaction, committed by its
// RELEASE while its Run says ErrGroupLost: whatever each Run says is what
// committed.
func TestGroupRolledBackUnderAFunction(t *testing.T) {
	gates(t, func(t *testing.T, newGate func() *sqldb.WriteGate) {
		db := open(t)
		g := newGate()
		errs := group(t, g, db,
			func(ctx context.Context, tx *sql.Tx) error {
				if err := insert("a")(ctx, tx); err != nil {
					return err
				}
				short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
				defer cancel()
				_, err := tx.ExecContext(short, `INSERT INTO rows (name) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 50000000) SELECT 'x' || i FROM n`)
				if err == nil {
					t.Error("a 50 million row insert finished within 5 ms")
				}
				return nil // ignored: the fault this test is about
			},
			insert("m"))
		got := names(t, db)
		if !errors.Is(errs[0], sqldb.ErrGroupLost) || got["a"] {
			t.Errorf("the function's Run = %v, its row committed %v; want ErrGroupLost and not", errs[0], got["a"])
		}
		if lost := errors.Is(errs[1], sqldb.ErrGroupLost); lost == got["m"] || (!lost && errs[1] != nil) {
			t.Errorf("the next Run = %v, its row committed %v; want nil and committed, or ErrGroupLost and not", errs[1], got["m"])
		}
	})
}
