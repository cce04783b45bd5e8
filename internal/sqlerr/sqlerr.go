// Package sqlerr tells database errors that mean "could not answer now"
// (the database is unreachable, restarting, or the pool is closed) from
// errors in the statement, for every driver the module's SQL packages
// meet (pgx, lib/pq, go-sql-driver/mysql, modernc.org/sqlite,
// mattn/go-sqlite3), without importing any of them.
package sqlerr

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"strings"
)

// Unavailable reports whether err means the database could not be reached
// or could not answer now: callers fail closed (503) or fall back, rather
// than treat it as an answer.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{
		"sql: database is closed", "connection refused", "connection reset", "broken pipe",
		"invalid connection", "bad connection", "EOF", "database is locked", "SQLITE_BUSY",
		"the database system is shutting down", "the database system is starting up",
		"terminating connection", "server closed the connection", "failed to connect",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
