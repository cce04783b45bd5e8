package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// An acquire whose statement committed but whose answer was lost (the
// caller's deadline passed while the answer was on its way) must not leave
// the lock held for its TTL with nobody holding it: redislock gives such a
// lock back with an owner-checked release; the lock table must too.
func TestLostAnswerLeaksLock(t *testing.T) {
	for _, d := range []struct {
		name    string
		dialect sqldialect.Dialect
		// latency per direction and the acquire's deadline: the statement
		// (after a prepare round trip on MySQL) lands, its answer does not
		latency, deadline time.Duration
		direct            func(t *testing.T) *sql.DB
		proxied           func(t *testing.T) (*sql.DB, *faultproxy.Proxy)
	}{
		{"postgres", sqldialect.Postgres, 150 * time.Millisecond, 220 * time.Millisecond,
			func(t *testing.T) *sql.DB { return dbtest.Postgres(t) },
			func(t *testing.T) (*sql.DB, *faultproxy.Proxy) {
				dsn, p := faultproxy.Front(t, os.Getenv("ONCEGUARD_TEST_POSTGRES"))
				return dbtest.OpenPostgres(t, dsn), p
			}},
		{"mysql", sqldialect.MySQL, 100 * time.Millisecond, 350 * time.Millisecond,
			func(t *testing.T) *sql.DB { return dbtest.MySQL(t) },
			func(t *testing.T) (*sql.DB, *faultproxy.Proxy) {
				p, err := faultproxy.Start("127.0.0.1:3306")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Heal(); _ = p.Close() })
				db, err := sql.Open("mysql", "root@tcp("+p.Addr()+")/test")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
				return db, p
			}},
	} {
		t.Run(d.name, func(t *testing.T) {
			direct := d.direct(t)
			pdb, proxy := d.proxied(t)
			table := fmt.Sprintf("og_lost_%d", time.Now().UnixNano()%1_000_000_000)
			t.Cleanup(func() { _, _ = direct.Exec("DROP TABLE IF EXISTS " + table) })
			opts := &sqllock.Options{Table: table}
			bp, _ := sqllock.New(pdb, d.dialect, opts)
			bd, _ := sqllock.New(direct, d.dialect, opts)
			ctx := context.Background()
			if err := bp.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			_ = bd.Migrate(ctx)
			// Warm the proxied pool and (MySQL) create the row, so the
			// acquire below is one statement.
			if g, err := bp.Acquire(ctx, lock.Request{Key: "k", Owner: "warm", TTL: time.Second}); err != nil {
				t.Fatal(g, err)
			}
			if err := bp.Release(ctx, "k", "warm"); err != nil {
				t.Fatal(err)
			}

			proxy.SetLatency(d.latency)
			actx, cancel := context.WithTimeout(ctx, d.deadline)
			_, err := bp.Acquire(actx, lock.Request{Key: "k", Owner: "lost-answer", TTL: time.Minute})
			cancel()
			if err == nil {
				t.Skip("the acquire was answered in time; the test wants it lost")
			}
			t.Logf("acquire whose answer was lost: %v", err)
			_ = proxy.Heal()
			time.Sleep(300 * time.Millisecond) // let the statement land whatever happened

			g, err := bd.Acquire(ctx, lock.Request{Key: "k", Owner: "next", TTL: time.Second})
			if err != nil {
				var owner sql.NullString
				_ = direct.QueryRow("SELECT owner FROM " + table).Scan(&owner)
				t.Fatalf("next acquire = %v (row owner %q); want the lock given back by the acquire that lost its answer, not held for its 1m TTL", err, owner.String)
			}
			_ = bd.Release(ctx, "k", "next")
			_ = g
		})
	}
}
