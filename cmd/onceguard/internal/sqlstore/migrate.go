// Package sqlstore is the reference service's database: the schema (one
// embedded migration set per dialect) and Store, which implements
// app.Store with one transaction per operation. Correctness lives here: UNIQUE(user_id, idempotency_key) on
// deposits, withdrawals and orders, and UNIQUE(user_id, order_id,
// idempotency_key) on payments (the API scopes a key to its path, which
// names the order), one successful payment per order (payments.paid_order_id
// is set only for the succeeded one, and is UNIQUE), balances that cannot
// go negative (CHECK), and one ledger entry per movement (UNIQUE(kind, ref)).
package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	stmts   []string
}

func migrations(d sqldialect.Dialect) ([]migration, error) {
	entries, err := migrationFS.ReadDir("migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, d.String()+"_") {
			continue
		}
		var v int
		if _, err := fmt.Sscanf(strings.TrimPrefix(name, d.String()+"_"), "%03d", &v); err != nil {
			return nil, fmt.Errorf("sqlstore: migration %s: no version", name)
		}
		b, err := migrationFS.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		var stmts []string
		for _, s := range strings.Split(string(b), ";") {
			if s = strings.TrimSpace(s); s != "" {
				stmts = append(stmts, s)
			}
		}
		ms = append(ms, migration{version: v, name: name, stmts: stmts})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	if len(ms) == 0 {
		return nil, fmt.Errorf("sqlstore: no migrations for dialect %q", d)
	}
	return ms, nil
}

// Migrate brings the schema up to date. Several processes may run it at
// once: they serialise on a database-wide lock and each applies only what
// is missing. On PostgreSQL the whole migration is one transaction holding
// pg_advisory_xact_lock, so that nothing is left on a session: behind
// PgBouncer in transaction pooling mode a session's advisory lock stays on
// whichever server connection took it (PITFALLS 9), and the statements
// after it may run on another. MySQL takes GET_LOCK and SQLite its write
// lock on one connection.
func Migrate(ctx context.Context, db *sql.DB, d sqldialect.Dialect) error {
	ms, err := migrations(d)
	if err != nil {
		return err
	}
	if d == sqldialect.Postgres {
		// READ COMMITTED whatever the database's default: a snapshot taken
		// at the lock's statement, before the lock is granted, would not
		// see what the instance that held it applied.
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLockKey); err != nil {
			return fmt.Errorf("sqlstore: migrate: lock: %w", err)
		}
		if err := apply(ctx, tx, d, ms); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
		return nil
	}
	conn, err := db.Conn(ctx) // the lock is the session's: one connection throughout
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	defer conn.Close()
	unlock, err := lockMigrations(ctx, conn, d)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: lock: %w", err)
	}
	if err := apply(ctx, conn, d, ms); err != nil {
		_ = unlock(false) // SQLite: roll back what the failed migration did
		return err
	}
	if err := unlock(true); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	return nil
}

// migrator is a connection or a transaction.
type migrator interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// apply applies the migrations of ms that schema_migrations does not
// list, on c, which holds the migration lock.
func apply(ctx context.Context, c migrator, d sqldialect.Dialect, ms []migration) error {
	if _, err := c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	applied := map[int]bool{}
	rows, err := c.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		applied[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	known := map[int]bool{}
	for _, m := range ms {
		known[m.version] = true
	}
	var unknown []int
	for v := range applied {
		if !known[v] {
			unknown = append(unknown, v)
		}
	}
	if len(unknown) > 0 {
		sort.Ints(unknown)
		return fmt.Errorf("sqlstore: migrate: the database has migration %d, which this version (migrations up to %03d) does not know: "+
			"it was migrated by a newer onceguard; run that version or newer", unknown[len(unknown)-1], ms[len(ms)-1].version)
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		resumed := true // still in the prefix a crash may have left applied
		for _, stmt := range m.stmts {
			_, err := c.ExecContext(ctx, stmt)
			if err != nil && d == sqldialect.MySQL && resumed && alreadyApplied(err) {
				// MySQL's DDL is not transactional: a migrator that died
				// between two statements left the first ones applied and
				// no row. Those are skipped, up to the first that runs.
				continue
			}
			if err != nil {
				return fmt.Errorf("sqlstore: migration %s: %w", m.name, err)
			}
			resumed = false
		}
		q := `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`
		if d == sqldialect.Postgres {
			q = sqldb.Rebind(q)
		}
		if _, err := c.ExecContext(ctx, q, m.version, m.name, time.Now().UnixMicro()); err != nil {
			return fmt.Errorf("sqlstore: migration %s: %w", m.name, err)
		}
	}
	return nil
}

// alreadyApplied reports MySQL's errors for DDL whose effect is there
// already: table exists (1050), duplicate column (1060), duplicate key
// name (1061).
func alreadyApplied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1050 || me.Number == 1060 || me.Number == 1061)
}

const migrateLockKey = 0x6f6e6365 // "once"

// lockMigrations takes the migration lock on conn; unlock(ok) releases
// it, on SQLite committing the migrations' transaction if ok and rolling
// it back if not.
func lockMigrations(ctx context.Context, conn *sql.Conn, d sqldialect.Dialect) (unlock func(ok bool) error, _ error) {
	bg := context.WithoutCancel(ctx)
	switch d {
	case sqldialect.MySQL:
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK('onceguard_migrate', 60)`).Scan(&got); err != nil {
			return nil, err
		}
		if got.Int64 != 1 {
			return nil, fmt.Errorf("GET_LOCK timed out")
		}
		return func(bool) error {
			_, _ = conn.ExecContext(bg, `SELECT RELEASE_LOCK('onceguard_migrate')`)
			return nil
		}, nil
	case sqldialect.SQLite:
		if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
			return nil, err
		}
		return func(ok bool) error {
			if !ok {
				_, err := conn.ExecContext(bg, `ROLLBACK`)
				return err
			}
			_, err := conn.ExecContext(bg, `COMMIT`)
			return err
		}, nil
	}
	return nil, fmt.Errorf("unknown dialect %q", d)
}
