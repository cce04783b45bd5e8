package sqlstore

import (
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// The statements the pending indexes serve, for the tests of their plans.
var (
	PendingQuery      = pendingQuery
	PendingCountQuery = pendingCountQuery
)

// Migrations returns how many migrations d has.
func Migrations(d sqldialect.Dialect) int {
	ms, err := migrations(d)
	if err != nil {
		panic(err)
	}
	return len(ms)
}

// MigrationStatements returns the statements of d's migration version.
func MigrationStatements(d sqldialect.Dialect, version int) []string {
	ms, err := migrations(d)
	if err != nil {
		panic(err)
	}
	for _, m := range ms {
		if m.version == version {
			return m.stmts
		}
	}
	return nil
}

// Gate is the store's write gate (SQLite; nil elsewhere), for tests that
// hold it to make a group.
func (s *Store) Gate() *sqldb.WriteGate { return s.gate }
