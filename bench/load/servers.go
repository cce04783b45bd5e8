package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"
)

// pgAdmin is a connection to the PostgreSQL server through which the run
// creates and drops its own databases.
type pgAdmin struct {
	db  *sql.DB
	dsn string
}

func openPG(ctx context.Context, dsn string) (*pgAdmin, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres %s: %w", redactURL(dsn), err)
	}
	return &pgAdmin{db: db, dsn: dsn}, nil
}

func (p *pgAdmin) close() { _ = p.db.Close() }

// nextXID is the next transaction id PostgreSQL will assign, read without
// taking one (the snapshot's xmax).
func (p *pgAdmin) nextXID() (int64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var x int64
	err := p.db.QueryRowContext(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&x)
	return x, err == nil
}

func (p *pgAdmin) describe(ctx context.Context) string {
	var version, syncCommit, maxConns string
	err := p.db.QueryRowContext(ctx, `SELECT split_part(version(), ' on ', 1), current_setting('synchronous_commit'), current_setting('max_connections')`).
		Scan(&version, &syncCommit, &maxConns)
	if err != nil {
		return "PostgreSQL: ? (" + err.Error() + ")"
	}
	host := "?"
	if u, err := url.Parse(p.dsn); err == nil {
		host = u.Host
	}
	return fmt.Sprintf("PostgreSQL: %s at %s, synchronous_commit=%s, max_connections=%s (shared with whatever else runs there)", version, host, syncCommit, maxConns)
}

// The run's database names are "ogload_<hex>[_pgbench]": safe as
// identifiers without quoting rules beyond the double quotes.
func (p *pgAdmin) createDB(ctx context.Context, name string) error {
	_, err := p.db.ExecContext(ctx, `CREATE DATABASE "`+name+`"`)
	if err != nil {
		return fmt.Errorf("CREATE DATABASE %s: %w", name, err)
	}
	return nil
}

// exec runs statements on the database of dsn, on a connection of its own.
func (p *pgAdmin) exec(ctx context.Context, dsn, statements string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, statements)
	return err
}

func (p *pgAdmin) dropDB(name string, keep bool, progress io.Writer) {
	if keep {
		fmt.Fprintf(progress, "kept database %s\n", name)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.db.ExecContext(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
		fmt.Fprintf(progress, "cleanup: DROP DATABASE %s: %v\n", name, err)
	}
}

// dbStats are a database's counters from pg_stat_database.
type dbStats struct {
	commits, rollbacks, inserted, updated, deleted int64
	ok                                             bool
}

// stats reads them once no session of the database is left (a backend
// flushes its counters when it exits; up to 5 s).
func (p *pgAdmin) stats(name string) dbStats {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var n int
		if err := p.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name).Scan(&n); err != nil || n == 0 {
			break
		}
	}
	var s dbStats
	err := p.db.QueryRowContext(ctx, `SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database WHERE datname = $1`, name).
		Scan(&s.commits, &s.rollbacks, &s.inserted, &s.updated, &s.deleted)
	s.ok = err == nil
	return s
}

// redisAdmin is this command's own client of the shared Redis: for its
// CPU figure and to delete the service's keys of this run's users.
type redisAdmin struct {
	rdb  *redis.Client
	addr string
}

func newRedisAdmin(rawURL string) (*redisAdmin, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("-redis %q: %w", redactURL(rawURL), err)
	}
	rdb := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis %s: %w", opt.Addr, err)
	}
	return &redisAdmin{rdb: rdb, addr: opt.Addr}, nil
}

func (r *redisAdmin) close() { _ = r.rdb.Close() }

func (r *redisAdmin) describe(ctx context.Context) string {
	version := "?"
	if info, err := r.rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				version = v
			}
		}
	}
	return fmt.Sprintf("Redis: %s at %s (shared; its CPU figure includes other clients)", version, r.addr)
}

// cpu is the server's CPU time so far (INFO cpu, all of its threads).
func (r *redisAdmin) cpu() (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := r.rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var secs float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			secs += f
		}
	}
	return time.Duration(secs * float64(time.Second)), true
}

// unlink deletes exactly the given keys and returns how many existed.
func (r *redisAdmin) unlink(keys []string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	for i := 0; i < len(keys); i += 500 {
		c, err := r.rdb.Unlink(ctx, keys[i:min(i+500, len(keys))]...).Result()
		if err != nil {
			return n, err
		}
		n += c
	}
	return n, nil
}
