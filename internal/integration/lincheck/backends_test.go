package lincheck

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/lock/redislock"
	"github.com/onceguard/onceguard/lock/redlock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// Every backend, one history each, checked with the exclusive model: 12
// to 16 clients contending for 3 keys, half of the attempts blocking, with
// rogue releases by random owners mixed in.

func TestMemlock(t *testing.T) {
	l := lock.New(&memlock.Backend{}, lockerOpts)
	exercise(t, l, workload{clients: 16, cycles: 150, keys: 3, rogue: true}, false)
}

// Tries only, so that a refused try must have met a holder (StrictTry): a
// lock that refuses a free key is caught too.
func TestMemlockTryOnly(t *testing.T) {
	l := lock.New(&memlock.Backend{}, lockerOpts)
	exercise(t, l, workload{clients: 8, cycles: 150, keys: 2, tryOnly: true, rogue: true}, true)
}

// prefix is a Redis key prefix of this run only: the shared server is
// never flushed.
func prefix(t *testing.T) string {
	return fmt.Sprintf("lincheck:%d:", time.Now().UnixNano())
}

// fenceRetention keeps the fence records a run leaves on the shared Redis
// for minutes, not the default day; a run is far shorter.
const fenceRetention = 5 * time.Minute

func TestRedis(t *testing.T) {
	rdb := redistest.Shared(t)
	l := lock.New(redislock.New(rdb, &redislock.Options{Prefix: prefix(t), FenceRetention: fenceRetention}), lockerOpts)
	exercise(t, l, workload{clients: 16, cycles: 50, keys: 3, rogue: true}, false)
}

func TestRedisClockFences(t *testing.T) {
	rdb := redistest.Shared(t)
	l := lock.New(redislock.New(rdb, &redislock.Options{Prefix: prefix(t), FenceRetention: fenceRetention, ClockFences: true}), lockerOpts)
	exercise(t, l, workload{clients: 16, cycles: 50, keys: 3, rogue: true}, false)
}

// Redlock over three redis-server processes of the test's own. Not
// StrictTry: a split vote refuses every contender while nobody holds.
func TestRedlock(t *testing.T) {
	var clients []redis.UniversalClient
	for range 3 {
		srv := redistest.StartServer(t)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	// A generous node timeout: no fault is injected here, and a node that
	// answers late under -race must not look down.
	backend, err := redlock.New(clients, &redlock.Options{NodeTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := lock.New(backend, lockerOpts)
	exercise(t, l, workload{clients: 12, cycles: 40, keys: 3, rogue: true}, false)
}

// databases, with cycles per client sized to each one's cost of a write
// (MySQL commits to disk; SQLite serializes every writer).
var databases = []struct {
	name    string
	dialect sqldialect.Dialect
	open    func(t *testing.T) *sql.DB
	cycles  int
}{
	{"postgres", sqldialect.Postgres, func(t *testing.T) *sql.DB { return dbtest.Postgres(t) }, 30},
	{"mysql", sqldialect.MySQL, func(t *testing.T) *sql.DB { return dbtest.MySQL(t) }, 20},
	{"sqlite", sqldialect.SQLite, func(t *testing.T) *sql.DB { return dbtest.SQLite(t) }, 20},
}

// The lock table on each database. StrictTry holds: the table has no
// waiter queue, and an upsert refused the row only because a live owner
// held it.
func TestSQL(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			b, err := sqllock.New(db, d.dialect, &sqllock.Options{Table: "lincheck_locks"})
			if err != nil {
				t.Fatal(err)
			}
			exercise(t, lock.New(b, lockerOpts), workload{clients: 12, cycles: d.cycles, keys: 3, rogue: true}, true)
		})
	}
}

// PostgreSQL's transaction-scoped advisory locks. Each held lease pins a
// connection; 12 clients on 3 keys stay well within the pool.
func TestSQLXact(t *testing.T) {
	db := dbtest.Postgres(t)
	backend, err := sqllock.NewXact(db)
	if err != nil {
		t.Fatal(err)
	}
	l := lock.New(backend, lockerOpts)
	exercise(t, l, workload{clients: 12, cycles: 40, keys: 3, rogue: true}, true)
}
