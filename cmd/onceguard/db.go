package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// sqliteConns is how many connections the service keeps open to SQLite.
const sqliteConns = 4

// openDB opens --db (default: SQLite under --data-dir, created if missing).
func openDB(c serveConfig) (*sql.DB, sqldialect.Dialect, string, error) {
	u := c.db
	var (
		driver, dsn string
		dialect     sqldialect.Dialect
	)
	sqlite := func(path string) {
		driver, dialect = "sqlite", sqldialect.SQLite
		dsn = sqldb.SQLiteDSN(path)
	}
	switch {
	case u == "":
		if err := os.MkdirAll(c.dataDir, 0o750); err != nil {
			return nil, 0, "", err
		}
		u = filepath.Join(c.dataDir, "onceguard.db")
		sqlite(u)
	case strings.HasPrefix(u, "sqlite://"):
		sqlite(strings.TrimPrefix(u, "sqlite://")) // sqlite:///abs/path or sqlite://rel/path
	case strings.HasPrefix(u, "postgres://"), strings.HasPrefix(u, "postgresql://"):
		driver, dsn, dialect = "pgx", boundTx(u, map[string]string{
			"lock_timeout":                        strconv.FormatInt(c.lockTTL.Milliseconds(), 10),
			"idle_in_transaction_session_timeout": strconv.FormatInt(c.lockTTL.Milliseconds(), 10),
			// Each statement is prepared once per connection and planned once
			// (a generic plan): the batched settlement's arrays would have
			// PostgreSQL plan it again at each execution, which costs more than
			// it runs (sqlstore.Store.BatchSettle; bench/README.md, issue 22).
			// The batched debit's statement (BatchDebit) is built the same way
			// and planned once too.
			// Every other statement finds its rows by key, where the generic
			// plan is the custom one.
			"plan_cache_mode": "force_generic_plan",
		}), sqldialect.Postgres
	case strings.HasPrefix(u, "mysql://"):
		secs := strconv.FormatInt(int64((c.lockTTL+time.Second-1)/time.Second), 10) // whole seconds, rounded up
		driver, dsn, dialect = "mysql", boundTx(strings.TrimPrefix(u, "mysql://"), map[string]string{
			"innodb_lock_wait_timeout": secs,
		}), sqldialect.MySQL
	default:
		return nil, 0, "", fmt.Errorf("--db %q: want sqlite:///path, postgres://... or mysql://...", redactURL(u))
	}
	var (
		db  *sql.DB
		err error
	)
	if dialect == sqldialect.MySQL {
		db, err = openMySQL(dsn, c.lockTTL)
	} else {
		db, err = sql.Open(driver, dsn)
	}
	if err != nil {
		return nil, 0, "", err
	}
	where := dialect.String() + " (" + redactURL(u) + ")"
	if dialect == sqldialect.Postgres {
		var pooled bool
		if db, pooled, err = behindPooler(db, u, c.lockTTL); err != nil {
			return nil, 0, "", err
		}
		if pooled {
			where += " behind a transaction pooler"
		}
	}
	if dialect == sqldialect.SQLite {
		// One writer at a time, and each new connection parses the schema: a few kept open,
		// the rest of a storm queued here rather than in SQLite's busy handler.
		db.SetMaxOpenConns(sqliteConns)
		db.SetMaxIdleConns(sqliteConns)
	} else {
		// A storm must queue for connections here, not exhaust the server's
		// (PostgreSQL's default max_connections is 100, for every instance).
		db.SetMaxOpenConns(c.dbConns)
		db.SetMaxIdleConns(c.dbConns)
		db.SetConnMaxIdleTime(time.Minute)
	}
	return db, dialect, where, nil
}

// behindPooler checks that the PostgreSQL sessions of db (opened on u
// with boundTx's settings) are bounded: a lock_timeout and an
// idle_in_transaction_session_timeout within ttl, without which a paused
// holder's transaction would keep its row locks. When the server refuses
// the settings as startup parameters (PgBouncer in transaction pooling
// mode does: "unsupported startup parameter"), it returns a pool on u
// without them, in pgx's exec query mode unless u names one (PgBouncer
// before 1.21 does not keep pgx's cached prepared statements), and pooled
// true: the bounds must then be the database's or the role's own (ALTER
// DATABASE ... SET). A pooler may also accept the settings and drop them
// (PgBouncer's ignore_startup_parameters): the check finds that too. When
// the bounds are missing the service refuses to start, saying what to
// run. A server that does not answer leaves db as it is: what uses it
// first reports that.
func behindPooler(db *sql.DB, u string, ttl time.Duration) (_ *sql.DB, pooled bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pgErr *pgconn.PgError
	err = db.PingContext(ctx)
	refused := errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.HasPrefix(pgErr.Message, "unsupported startup parameter")
	if err != nil && !refused {
		return db, false, nil
	}
	if refused {
		_ = db.Close()
		if !strings.Contains(u, "default_query_exec_mode=") {
			u = boundTx(u, map[string]string{"default_query_exec_mode": "exec"})
		}
		if db, err = sql.Open("pgx", u); err != nil {
			return nil, false, err
		}
	}
	if err := checkSessionBounds(ctx, db, u, ttl, refused); err != nil {
		_ = db.Close()
		return nil, false, err
	}
	return db, refused, nil
}

// checkSessionBounds checks that the sessions' lock_timeout and
// idle_in_transaction_session_timeout are set and within ttl, except one
// that the URL u names (the user's own choice). refused tells the error
// which way the service's own settings were lost.
func checkSessionBounds(ctx context.Context, db *sql.DB, u string, ttl time.Duration, refused bool) error {
	var name string
	var lockMS, idleMS int64
	err := db.QueryRowContext(ctx, `SELECT current_database(),
  (SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout'),
  (SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout')`).Scan(&name, &lockMS, &idleMS)
	if err != nil {
		return fmt.Errorf("--db: reading the server's session settings: %w", err)
	}
	limit := ttl.Milliseconds()
	bounded := func(setting string, ms int64) bool {
		return strings.Contains(u, setting+"=") || (ms > 0 && ms <= limit)
	}
	if bounded("lock_timeout", lockMS) && bounded("idle_in_transaction_session_timeout", idleMS) {
		return nil
	}
	why := "the session settings the service sends at connect are not in effect (a pooler that drops " +
		"them does that: PgBouncer's ignore_startup_parameters)"
	if refused {
		why = "the server refused the session settings as startup parameters, as a pooler in " +
			"transaction mode (PgBouncer) does"
	}
	db2 := `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
	return fmt.Errorf("--db: %s, and the sessions' own lock_timeout (%dms) and "+
		"idle_in_transaction_session_timeout (%dms) are not both between 1ms and the lock TTL "+
		"(%dms, serve's --lock-ttl); set them on the database, then start again:\n"+
		"  ALTER DATABASE %s SET lock_timeout = '%dms';\n"+
		"  ALTER DATABASE %s SET idle_in_transaction_session_timeout = '%dms';\n"+
		"  ALTER DATABASE %s SET plan_cache_mode = force_generic_plan; -- optional: each statement planned once\n"+
		"(a role's own setting, ALTER ROLE ... SET, overrides the database's; new server connections "+
		"get them: restart the pooler's, or RECONNECT in PgBouncer's console)",
		why, lockMS, idleMS, limit, db2, limit, db2, limit, db2)
}

// checkpoints checkpoints SQLite's WAL beside the writers
// (sqldb.CheckpointWAL), not in the commit that crosses SQLite's threshold,
// until stop is called; on the other databases it does nothing.
func checkpoints(db *sql.DB, d sqldialect.Dialect) (stop func()) {
	if d != sqldialect.SQLite {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		sqldb.CheckpointWAL(ctx, db, sqldb.CheckpointEvery)
	}()
	return func() { cancel(); <-done }
}

// boundTx adds to a database URL or DSN the session settings in set that
// it does not name already: they bound how long a transaction waits on a
// row lock and how long an idle one (its holder paused) keeps its locks,
// both to the lock TTL, so a paused holder costs the others no more than
// an expired lock does.
func boundTx(dsn string, set map[string]string) string {
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if strings.Contains(dsn, k+"=") {
			continue
		}
		sep := "&"
		if !strings.Contains(dsn, "?") {
			sep = "?"
		}
		dsn += sep + k + "=" + set[k]
	}
	return dsn
}

// openMySQL opens dsn with each new connection's idle transactions bounded
// by ttl where the server can (MariaDB's idle_transaction_timeout, which
// ends a paused holder's transaction); MySQL has no such variable, and
// naming it in the DSN would fail every connection there.
func openMySQL(dsn string, ttl time.Duration) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	if ttl <= 0 || strings.Contains(dsn, "idle_transaction_timeout=") {
		return sql.OpenDB(connector), nil // no bound asked, or the operator's own
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	return sql.OpenDB(idleBound{connector, fmt.Sprintf("SET SESSION idle_transaction_timeout = %d", secs)}), nil
}

// idleBound runs stmt on every new connection, ignoring only the error of a
// server that does not know the variable.
type idleBound struct {
	driver.Connector
	stmt string
}

func (c idleBound) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		return conn, nil
	}
	if _, err := ex.ExecContext(ctx, c.stmt, nil); err != nil {
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1193 { // 1193: unknown system variable (MySQL)
			conn.Close()
			return nil, err
		}
	}
	return conn, nil
}

// passwordParam is a password given as a parameter (pgx takes password
// and sslpassword in a URL's query, libpq's key/value form too).
var passwordParam = regexp.MustCompile(`(?i)((?:^|[?&\s])(?:ssl)?password=)('[^']*'|[^&\s]*)`)

// redactURL hides a password in a database URL (or DSN) before it is
// logged: the user info's (with or without a scheme, as in
// go-sql-driver's user:pass@tcp(host)/db) and a password parameter's.
func redactURL(u string) string {
	u = passwordParam.ReplaceAllString(u, "${1}***")
	if at := strings.LastIndex(u, "@"); at > 0 {
		start := 0
		if i := strings.Index(u, "://"); i >= 0 {
			start = i + 3
		}
		if start < at {
			cred := u[start:at]
			if c := strings.Index(cred, ":"); c >= 0 {
				return u[:start] + cred[:c] + ":***" + u[at:]
			}
		}
	}
	return u
}
