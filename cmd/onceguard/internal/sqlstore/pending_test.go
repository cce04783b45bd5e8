package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// The reconciler's pending lookups, its backlog count after every pass
// (PendingCount) and Pending, read the pending indexes of migration 003
// (MySQL, SQLite) or the backlog table of migration 008 (PostgreSQL), not
// the whole deposits and withdrawals tables, which only grow: with 2000
// settled rows and 5 pending in each table, each dialect's plan of both
// statements scans neither table, and on MySQL and SQLite uses the index
// and sorts nothing (PostgreSQL sorts the backlog, which holds only the
// pending rows). Both on a fresh database and on one at migration 1, with
// its rows, that upgrades (migration 008 fills the backlog table).
func TestPendingIndexes(t *testing.T) {
	for _, d := range databases {
		for _, upgrade := range []bool{false, true} {
			name := d.name + "/fresh"
			if upgrade {
				name = d.name + "/upgrade_from_1"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				db := d.open(t)
				fresh(t, db)
				if upgrade {
					migrateTo1(t, db, d.dialect)
					seedMovements(t, db)
				}
				if err := sqlstore.Migrate(ctx, db, d.dialect); err != nil {
					t.Fatalf("Migrate = %v", err)
				}
				var n int
				if err := db.QueryRow("SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n != sqlstore.Migrations(d.dialect) {
					t.Errorf("schema_migrations rows = %d, %v; want %d", n, err, sqlstore.Migrations(d.dialect))
				}
				if !upgrade {
					seedMovements(t, db)
					if d.dialect == sqldialect.Postgres { // as the store's inserts do
						if _, err := db.Exec(`INSERT INTO pending_movements (id, kind, created_at)
SELECT id, 'deposit', created_at FROM deposits WHERE status = 'pending'
UNION ALL SELECT id, 'withdrawal', created_at FROM withdrawals WHERE status = 'pending'`); err != nil {
							t.Fatal(err)
						}
					}
				}
				analyze(t, db, d.dialect)

				if got, err := sqlstore.Open(db, d.dialect).PendingCount(ctx); err != nil || got != 10 {
					t.Errorf("PendingCount = %d, %v; want 10", got, err)
				}
				s := sqlstore.Open(db, d.dialect)
				got, err := s.Pending(ctx, app.Withdrawal, 3)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, m := range got {
					ids = append(ids, m.ID)
				}
				if want := "w0007 w0407 w0807"; strings.Join(ids, " ") != want {
					t.Errorf("Pending(withdrawals, 3) = %v; want %s (the oldest pending, in order)", ids, want)
				}

				checkPlan(t, db, d.dialect, "backlog count", sqlstore.PendingCountQuery(d.dialect), nil, false, "deposits", "withdrawals")
				for _, tb := range []string{"deposits", "withdrawals"} {
					checkPlan(t, db, d.dialect, "pending "+tb, sqlstore.PendingQuery(d.dialect, tb), []any{100}, true, tb)
				}
			})
		}
	}
}

// migrateTo1 leaves db as Migrate left a database when migration 1 was
// the last: its statements applied and recorded.
func migrateTo1(t *testing.T, db *sql.DB, d sqldialect.Dialect) {
	t.Helper()
	name := d.String() + "_001_init.sql"
	b, err := os.ReadFile("migrations/" + name)
	if err != nil {
		t.Fatal(err)
	}
	stmts := []string{`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL)`}
	for _, s := range strings.Split(string(b), ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (1, '%s', %d)`, name, time.Now().UnixMicro()))
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// seedMovements adds user u1 and, in deposits and withdrawals each, 2000
// settled rows and 5 pending ones among them (numbers 7, 407, ... 1607).
// The columns are those of migration 1.
func seedMovements(t *testing.T, db *sql.DB) {
	t.Helper()
	stmts := []string{`INSERT INTO users (id, username, password_hash, created_at) VALUES ('u1', 'alice', 'h', 1)`}
	for _, tb := range []string{"deposits", "withdrawals"} {
		var vals []string
		for i := range 2005 {
			status := []string{"succeeded", "failed"}[i%2]
			if i%400 == 7 {
				status = "pending"
			}
			vals = append(vals, fmt.Sprintf("('%s%04d', 'u1', 'k%04d', 100, '%s', %d)", tb[:1], i, i, status, 1000+i))
			if len(vals) == 250 || i == 2004 {
				stmts = append(stmts, `INSERT INTO `+tb+` (id, user_id, idempotency_key, amount, status, created_at) VALUES `+strings.Join(vals, ", "))
				vals = nil
			}
		}
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
}

// analyze refreshes the planner's statistics of the movement tables.
func analyze(t *testing.T, db *sql.DB, d sqldialect.Dialect) {
	t.Helper()
	q := map[sqldialect.Dialect]string{
		sqldialect.Postgres: `ANALYZE deposits, withdrawals`,
		sqldialect.MySQL:    `ANALYZE TABLE deposits, withdrawals`,
		sqldialect.SQLite:   `ANALYZE`,
	}[d]
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// checkPlan explains query on db and fails unless each of tables is read
// through its pending index (tb_pending) and none is scanned whole; with
// ordered, unless the index's order serves the ORDER BY (no sort).
func checkPlan(t *testing.T, db *sql.DB, d sqldialect.Dialect, what, query string, args []any, ordered bool, tables ...string) {
	t.Helper()
	explain := `EXPLAIN ` + query
	switch d {
	case sqldialect.Postgres:
		explain = sqldb.Rebind(explain)
	case sqldialect.SQLite:
		explain = `EXPLAIN QUERY PLAN ` + query
	}
	rows := explainRows(t, db, explain, args)
	var lines []string
	for _, r := range rows {
		var cols []string
		for _, c := range []string{"query plan", "table", "type", "key", "rows", "extra", "detail"} {
			if v, ok := r[c]; ok {
				cols = append(cols, c+"="+v)
			}
		}
		lines = append(lines, strings.Join(cols, " "))
	}
	text := strings.Join(lines, "\n")
	t.Logf("%s plan of %s:\n%s", d, what, text)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: %s (plan above)", what, fmt.Sprintf(format, args...))
	}
	if d == sqldialect.Postgres && !strings.Contains(text, "pending_movements") {
		fail("the backlog table pending_movements is not in the plan")
	}
	for _, tb := range tables {
		index := tb + "_pending"
		switch d {
		case sqldialect.Postgres: // read by key from the backlog, if at all
			if strings.Contains(text, "Seq Scan on "+tb) {
				fail("a sequential scan of %s", tb)
			}
		case sqldialect.MySQL:
			found := false
			for _, r := range rows {
				if r["table"] != tb {
					continue
				}
				found = true
				if r["key"] != index {
					fail("%s read with key %q; want %s", tb, r["key"], index)
				}
				if r["type"] == "ALL" || r["type"] == "index" {
					fail("%s read by a full scan (type %s)", tb, r["type"])
				}
			}
			if !found {
				fail("%s not in the plan", tb)
			}
		case sqldialect.SQLite:
			uses := regexp.MustCompile(`^(SCAN|SEARCH) ` + tb + ` USING (COVERING )?INDEX ` + index + `\b`)
			found := false
			for _, r := range rows {
				found = found || uses.MatchString(r["detail"])
				if r["detail"] == "SCAN "+tb {
					fail("a full scan of %s", tb)
				}
			}
			if !found {
				fail("%s not read through %s", tb, index)
			}
		}
	}
	if ordered && d != sqldialect.Postgres {
		sorted := map[sqldialect.Dialect]string{sqldialect.Postgres: "Sort", sqldialect.MySQL: "filesort", sqldialect.SQLite: "TEMP B-TREE"}[d]
		if strings.Contains(text, sorted) {
			fail("a sort (%s): the index's order does not serve the ORDER BY", sorted)
		}
	}
}

// explainRows runs an EXPLAIN and returns its rows, each column by its
// lower-case name.
func explainRows(t *testing.T, db *sql.DB, explain string, args []any) []map[string]string {
	t.Helper()
	rows, err := db.Query(explain, args...)
	if err != nil {
		t.Fatalf("%s: %v", explain, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		r := map[string]string{}
		for i, c := range cols {
			r[strings.ToLower(c)] = vals[i].String
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
