// Package sqldb holds what the module's SQL code shares across dialects
// and drivers, without importing any driver: telling errors that mean
// "the database could not answer now" from errors in the statement (pgx,
// lib/pq, go-sql-driver/mysql, modernc.org/sqlite, mattn/go-sqlite3), and
// PostgreSQL's placeholders.
package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"
)

// Unavailable reports whether err means the database could not be reached
// or could not answer now: callers fail closed (503) or fall back, rather
// than treat it as an answer.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, ErrGroupLost) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{
		"sql: database is closed", "connection refused", "connection reset", "broken pipe",
		"invalid connection", "bad connection", "EOF", "database is locked", "SQLITE_BUSY",
		"the database system is shutting down", "the database system is starting up",
		"terminating connection", "server closed the connection", "failed to connect",
		"conn closed", "conn busy", // pgx: the connection died under the statement or the commit
		"Too many connections", "too many clients", "too many connections", // MySQL 1040, PostgreSQL 53300
		"Lock wait timeout exceeded", "Deadlock found", "deadlock detected", // a retry may succeed
		"lock timeout", "idle-in-transaction timeout", "idle transaction timeout", // a bounded wait or holder
		"could not serialize access",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Rebind turns ? placeholders into PostgreSQL's $1, $2, ... (queries here
// never hold a literal question mark).
func Rebind(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Create runs a CREATE ... IF NOT EXISTS statement, up to three times 50ms
// apart: concurrent ones can collide in PostgreSQL's catalog. It stops
// early when ctx ends.
func Create(ctx context.Context, db *sql.DB, stmt string) error {
	var err error
	for try := range 3 {
		if try > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err = db.ExecContext(ctx, stmt); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}
