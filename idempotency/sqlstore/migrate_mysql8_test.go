package sqlstore

import (
	"regexp"
	"testing"

	"github.com/onceguard/onceguard/sqldialect"
)

// MySQL 8 (sqldialect.MySQL: "MySQL 8 and MariaDB 10.5+") has no
// CREATE INDEX ... IF NOT EXISTS (only MariaDB has): such a statement is a
// syntax error there (Error 1064), and Migrate fails on every MySQL 8.
func TestMySQLSchemaHasNoCreateIndexIfNotExists(t *testing.T) {
	re := regexp.MustCompile(`(?i)CREATE\s+(UNIQUE\s+)?INDEX\s+IF\s+NOT\s+EXISTS`)
	for _, stmt := range buildQueries(sqldialect.MySQL, "onceguard_").create {
		if re.MatchString(stmt) {
			t.Errorf("MySQL schema statement %q: MySQL 8 has no CREATE INDEX IF NOT EXISTS", stmt)
		}
	}
}
