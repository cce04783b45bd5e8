package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redlock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// benchTable is the sqllock table of the backends group, in PostgreSQL,
// MySQL and SQLite alike. It is dropped before and after the run.
const benchTable = "ogbench_locks"

// The libraries of the backends group, in table order.
const (
	libSQLPG     = "sqllock-pg"
	libSQLPGXact = "sqllock-pg-xact"
	libPGBase    = "pg-xact-baseline"
	libSQLMySQL  = "sqllock-mysql"
	libSQLSQLite = "sqllock-sqlite"
	libRedlock   = "redlock-3"
)

var backendLibs = []string{libSQLPG, libSQLPGXact, libPGBase, libSQLMySQL, libSQLSQLite, libRedlock}

// poolSize is the database/sql setting of every PostgreSQL and MySQL pool
// (SetMaxOpenConns and SetMaxIdleConns): more than the 16 goroutines of the
// largest scenario, so nobody waits for a connection in the pool.
const poolSize = 32

// cleanups runs functions in reverse order of registration.
type cleanups []func()

func (c *cleanups) add(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// backendSetup is what setupBackends prepared.
type backendSetup struct {
	libs    []*library
	servers []string // one line per server, for the report's header
	skipped []string // libraries that could not be set up, and why
}

// setupBackends prepares the selected libraries of the backends group. A
// library whose server cannot be reached is skipped with a note, not an
// error. Everything it starts or creates is undone by cl (registered as it
// goes, so that a failure half-way still cleans up).
func setupBackends(ctx context.Context, cfg *config, progress io.Writer, cl *cleanups) (*backendSetup, error) {
	bs := &backendSetup{}
	want := func(lib string) bool { return cfg.libSelected(lib, groupBackends) }
	skip := func(lib string, err error) {
		bs.skipped = append(bs.skipped, fmt.Sprintf("%s: %v", lib, err))
		fmt.Fprintf(progress, "skipping %s: %v\n", lib, err)
	}

	if want(libSQLPG) || want(libSQLPGXact) || want(libPGBase) {
		if cfg.pgDSN == "" {
			skip(libSQLPG+", "+libPGBase, errors.New("no -pg DSN"))
		} else if libs, info, err := setupPostgres(ctx, cfg.pgDSN, want(libSQLPG), want(libSQLPGXact), want(libPGBase), cl); err != nil {
			skip(libSQLPG+", "+libPGBase, err)
		} else {
			bs.libs = append(bs.libs, libs...)
			bs.servers = append(bs.servers, info)
		}
	}
	if want(libSQLMySQL) {
		if cfg.mysqlDSN == "" {
			skip(libSQLMySQL, errors.New("no -mysql DSN"))
		} else if lib, info, err := setupMySQL(ctx, cfg.mysqlDSN, cl); err != nil {
			skip(libSQLMySQL, err)
		} else {
			bs.libs = append(bs.libs, lib)
			bs.servers = append(bs.servers, info)
		}
	}
	if want(libSQLSQLite) {
		if !cfg.sqlite {
			skip(libSQLSQLite, errors.New("-sqlite=false"))
		} else if lib, info, err := setupSQLite(ctx, cfg.sqliteConns, cl); err != nil {
			skip(libSQLSQLite, err)
		} else {
			bs.libs = append(bs.libs, lib)
			bs.servers = append(bs.servers, info)
		}
	}
	if want(libRedlock) {
		if cfg.redlockNodes < 1 || cfg.redisServer == "" {
			skip(libRedlock, errors.New("-redlock-nodes 0 or no -redis-server"))
		} else if lib, info, err := setupRedlock(ctx, cfg.redisServer, cfg.redlockNodes, cl); err != nil {
			// Unlike an unreachable database, a redis-server that does not
			// start is the bench's own failure: report it as an error.
			return bs, fmt.Errorf("%s: %w", libRedlock, err)
		} else {
			bs.libs = append(bs.libs, lib)
			bs.servers = append(bs.servers, info)
		}
	}
	// Table order.
	var ordered []*library
	for _, name := range backendLibs {
		for _, l := range bs.libs {
			if l.name == name {
				l.group = groupBackends
				ordered = append(ordered, l)
			}
		}
	}
	bs.libs = ordered
	return bs, nil
}

// openPool opens a database/sql pool with the bench's pool settings and
// dials as many connections as the largest scenario has goroutines, so
// that no cell pays for dialing (and go-sql-driver/mysql's per-connection
// goroutines exist before the first cell counts goroutines).
func openPool(ctx context.Context, driver, dsn string, conns int) (*sql.DB, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	warm := 1
	for _, sc := range scenarios {
		if sc.group == groupBackends {
			warm = max(warm, sc.goroutines)
		}
	}
	warm = min(warm, conns)
	var held []*sql.Conn
	for range warm {
		c, err := db.Conn(pctx)
		if err == nil {
			err = c.PingContext(pctx)
		}
		if err != nil {
			for _, c := range held {
				_ = c.Close()
			}
			_ = db.Close()
			return nil, err
		}
		held = append(held, c)
	}
	for _, c := range held {
		_ = c.Close() // back to the pool, still open
	}
	return db, nil
}

// dropTable drops the bench table, on a context of its own so that it runs
// after an interrupt too.
func dropTable(db *sql.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+benchTable)
	return err
}

// sqlCleanup deletes the rows of a cell and counts those still held. q is
// the dialect's count and delete statements, each taking the prefix's
// length in bytes and the prefix.
func sqlCleanup(db *sql.DB, count, del string) func(ctx context.Context, prefix string) (int64, error) {
	return func(ctx context.Context, prefix string) (int64, error) {
		var held int64
		if err := db.QueryRowContext(ctx, count, len(prefix), []byte(prefix)).Scan(&held); err != nil {
			return 0, err
		}
		_, err := db.ExecContext(ctx, del, len(prefix), []byte(prefix))
		return held, err
	}
}

// loopback reports whether host is this machine, where the server's
// processes can be seen in /proc.
func loopback(host string) bool {
	if host == "localhost" || strings.HasPrefix(host, "/") { // a Unix socket directory
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// --- PostgreSQL: sqllock and the bare advisory-lock baseline ----------------

func setupPostgres(ctx context.Context, dsn string, withLock, withXact, withBase bool, cl *cleanups) ([]*library, string, error) {
	pcfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, "", err
	}
	var serverCPU func() (time.Duration, bool)
	where := fmt.Sprintf("%s:%d", pcfg.Host, pcfg.Port)
	if loopback(pcfg.Host) {
		serverCPU = func() (time.Duration, bool) { return procCPU("postgres") }
		where += " (same machine)"
	}
	// admin: table drops, cleanup between cells, the baseline's lock check.
	admin, err := openPool(ctx, "pgx", dsn, 2)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = admin.Close() })
	var version, sync string
	if err := admin.QueryRowContext(ctx, "SELECT current_setting('server_version'), current_setting('synchronous_commit')").Scan(&version, &sync); err != nil {
		return nil, "", err
	}
	if err := dropTable(admin); err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = dropTable(admin) })
	info := fmt.Sprintf("PostgreSQL %s at %s, synchronous_commit=%s; sqllock table %s UNLOGGED (sqllock's default)", version, where, sync, benchTable)

	var libs []*library
	if withLock {
		db, err := openPool(ctx, "pgx", dsn, poolSize)
		if err != nil {
			return nil, "", err
		}
		cl.add(func() { _ = db.Close() })
		backend, err := sqllock.New(db, sqldialect.Postgres, &sqllock.Options{Table: benchTable})
		if err != nil {
			return nil, "", err
		}
		l := lock.New(backend, nil)
		libs = append(libs, &library{
			name:      libSQLPG,
			newWorker: func(key string) worker { return &ogWorker{l: l, key: key} },
			serverCPU: serverCPU,
			cleanup: sqlCleanup(admin,
				`SELECT count(*) FROM `+benchTable+` WHERE substring(name from 1 for $1) = $2 AND owner IS NOT NULL`,
				`DELETE FROM `+benchTable+` WHERE substring(name from 1 for $1) = $2`),
			close: func() {},
		})
	}
	if withXact {
		db, err := openPool(ctx, "pgx", dsn, poolSize)
		if err != nil {
			return nil, "", err
		}
		cl.add(func() { _ = db.Close() })
		backend, err := sqllock.NewXact(db)
		if err != nil {
			return nil, "", err
		}
		l := lock.New(backend, nil)
		libs = append(libs, &library{
			name:      libSQLPGXact,
			newWorker: func(key string) worker { return &ogWorker{l: l, key: key} },
			serverCPU: serverCPU,
			cleanup:   func(context.Context, string) (int64, error) { return 0, nil }, // transaction-scoped: nothing stays
			close:     func() {},
		})
	}
	if withBase {
		db, err := openPool(ctx, "pgx", dsn, poolSize)
		if err != nil {
			return nil, "", err
		}
		cl.add(func() { _ = db.Close() })
		// Every key of the run shares its high 32 bits (random, positive),
		// so that pg_locks can tell ours apart: classid is the high half of
		// a bigint advisory key, objid the low half, objsubid 1.
		var rb [4]byte
		_, _ = rand.Read(rb[:])
		high := int64(binary.BigEndian.Uint32(rb[:]) & 0x7fffffff)
		var next atomic.Int64
		libs = append(libs, &library{
			name: libPGBase,
			newWorker: func(string) worker {
				return &pgXactWorker{db: db, key: high<<32 | next.Add(1)}
			},
			serverCPU: serverCPU,
			cleanup: func(ctx context.Context, _ string) (int64, error) {
				// Transaction-scoped: nothing to delete; count any still held.
				var held int64
				err := admin.QueryRowContext(ctx,
					`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND classid = $1::bigint::oid`,
					high).Scan(&held)
				return held, err
			},
			close: func() {},
		})
	}
	return libs, info, nil
}

// pgXactWorker is the baseline: one transaction per cycle through
// database/sql, BEGIN; SELECT pg_try_advisory_xact_lock(key); COMMIT. The
// lock is the transaction's, so COMMIT is the release. Each goroutine has
// its own 64-bit key.
type pgXactWorker struct {
	db  *sql.DB
	key int64
	tx  *sql.Tx
}

func (w *pgXactWorker) try(ctx context.Context) (bool, error) {
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	var ok bool
	if err := tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", w.key).Scan(&ok); err != nil {
		_ = tx.Rollback()
		return false, err
	}
	if !ok {
		_ = tx.Rollback()
		return false, nil
	}
	w.tx = tx
	return true, nil
}

func (w *pgXactWorker) block(context.Context) error {
	return errors.New("pg-xact-baseline: no blocking scenario")
}

func (w *pgXactWorker) unlock(context.Context) error {
	tx := w.tx
	w.tx = nil
	if tx == nil {
		return errors.New("pg-xact-baseline: unlock without a transaction")
	}
	return tx.Commit()
}

// --- MySQL / MariaDB ----------------------------------------------------------

func setupMySQL(ctx context.Context, dsn string, cl *cleanups) (*library, string, error) {
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", err
	}
	var serverCPU func() (time.Duration, bool)
	where := mcfg.Addr
	host, _, _ := net.SplitHostPort(mcfg.Addr)
	if mcfg.Net == "unix" || loopback(host) {
		serverCPU = func() (time.Duration, bool) { return procCPU("mariadbd", "mysqld") }
		where += " (same machine)"
	}
	admin, err := openPool(ctx, "mysql", dsn, 2)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = admin.Close() })
	var version, flush string
	if err := admin.QueryRowContext(ctx, "SELECT VERSION(), @@innodb_flush_log_at_trx_commit").Scan(&version, &flush); err != nil {
		return nil, "", err
	}
	if err := dropTable(admin); err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = dropTable(admin) })
	db, err := openPool(ctx, "mysql", dsn, poolSize)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = db.Close() })
	backend, err := sqllock.New(db, sqldialect.MySQL, &sqllock.Options{Table: benchTable})
	if err != nil {
		return nil, "", err
	}
	l := lock.New(backend, nil)
	info := fmt.Sprintf("MySQL/MariaDB %s at %s, InnoDB, innodb_flush_log_at_trx_commit=%s", version, where, flush)
	return &library{
		name:      libSQLMySQL,
		newWorker: func(key string) worker { return &ogWorker{l: l, key: key} },
		serverCPU: serverCPU,
		cleanup: sqlCleanup(admin,
			`SELECT COUNT(*) FROM `+benchTable+` WHERE LEFT(name, ?) = ? AND owner IS NOT NULL`,
			`DELETE FROM `+benchTable+` WHERE LEFT(name, ?) = ?`),
		close: func() {},
	}, info, nil
}

// --- SQLite (modernc.org/sqlite, in process) -----------------------------------

func setupSQLite(ctx context.Context, conns int, cl *cleanups) (*library, string, error) {
	dir, err := os.MkdirTemp("", "ogbench-sqlite-")
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = os.RemoveAll(dir) })
	dsn := "file:" + dir + "/bench.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	db, err := openPool(ctx, "sqlite", dsn, conns)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = db.Close() })
	var version string
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		return nil, "", err
	}
	backend, err := sqllock.New(db, sqldialect.SQLite, &sqllock.Options{Table: benchTable})
	if err != nil {
		return nil, "", err
	}
	l := lock.New(backend, nil)
	info := fmt.Sprintf("SQLite %s (modernc.org/sqlite, in this process), a file in a temporary directory, WAL, synchronous=NORMAL, busy_timeout 10s, pool of %d connection(s)", version, conns)
	return &library{
		name:      libSQLSQLite,
		newWorker: func(key string) worker { return &ogWorker{l: l, key: key} },
		cleanup: sqlCleanup(db,
			`SELECT count(*) FROM `+benchTable+` WHERE substr(name, 1, ?1) = ?2 AND owner IS NOT NULL`,
			`DELETE FROM `+benchTable+` WHERE substr(name, 1, ?1) = ?2`),
		close: func() {},
	}, info, nil
}

// --- redlock over private redis-server processes --------------------------------

func setupRedlock(ctx context.Context, bin string, n int, cl *cleanups) (*library, string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "ogbench-redlock-")
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { _ = os.RemoveAll(dir) })
	nodes, err := startRedisNodes(ctx, path, n, dir)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() { stopRedisNodes(nodes) })
	var clients []redis.UniversalClient
	var admins []*redis.Client
	var addrs []string
	for _, node := range nodes {
		c := redis.NewClient(clientOptions(node.addr)) // the same settings as the Redis group's clients
		a := redis.NewClient(clientOptions(node.addr))
		cl.add(func() { _ = c.Close(); _ = a.Close() })
		clients = append(clients, c)
		admins = append(admins, a)
		addrs = append(addrs, node.addr)
	}
	b, err := redlock.New(clients, nil)
	if err != nil {
		return nil, "", err
	}
	l := lock.New(b, nil)
	info := fmt.Sprintf("redlock: %d redis-server %s processes started by the bench at %s (no persistence)",
		n, redisVersion(ctx, admins[0]), strings.Join(addrs, ", "))
	return &library{
		name:      libRedlock,
		newWorker: func(key string) worker { return &ogWorker{l: l, key: key} },
		serverCPU: func() (time.Duration, bool) {
			var sum time.Duration
			for _, a := range admins {
				d, ok := redisCPU(a)
				if !ok {
					return 0, false
				}
				sum += d
			}
			return sum, true
		},
		cleanup: func(ctx context.Context, prefix string) (int64, error) {
			b.Wait() // the calls still out to a slow node, late grants undone
			var held int64
			var errs error
			for _, a := range admins {
				h, err := redisCleanup(a)(ctx, prefix)
				held += h
				errs = errors.Join(errs, err)
			}
			return held, errs
		},
		close: func() {},
	}, info, nil
}
