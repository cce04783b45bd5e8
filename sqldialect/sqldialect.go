// Package sqldialect names the SQL dialects of the database/sql backends
// (lock/sqllock, idempotency/sqlstore), so that one value describes a
// *sql.DB to all of them.
package sqldialect

import "fmt"

// Dialect names the SQL dialect of a *sql.DB.
type Dialect int

// The supported dialects.
const (
	Postgres Dialect = iota + 1 // PostgreSQL
	MySQL                       // MySQL 8 and MariaDB 10.5+
	SQLite                      // SQLite 3.35+
)

// String returns the dialect's name: "postgres", "mysql" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}
