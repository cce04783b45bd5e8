package outbox_test

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// New and Schema refuse what would make bad SQL, and do no I/O (the
// *sql.DB here has no driver behind it).
func TestNewRefuses(t *testing.T) {
	db := &sql.DB{}
	for _, c := range []struct {
		db      *sql.DB
		dialect sqldialect.Dialect
		table   string
	}{
		{nil, sqldialect.SQLite, ""},
		{db, 0, ""},
		{db, sqldialect.SQLite + 1, ""},
		{db, sqldialect.SQLite, "bad-name"},
		{db, sqldialect.SQLite, "x; DROP TABLE users"},
	} {
		if _, err := outbox.New(c.db, c.dialect, &outbox.Options{Table: c.table}); err == nil {
			t.Errorf("New(%v, %v, %q) = nil error", c.db != nil, c.dialect, c.table)
		}
	}
	o, err := outbox.New(db, sqldialect.MySQL, nil)
	if err != nil || o.Table() != "onceguard_outbox" {
		t.Fatalf("New = %v, table %q; want the default table onceguard_outbox", err, o.Table())
	}
	if _, err := outbox.NewRelay(nil, outbox.PublisherFunc(nil), nil); err == nil {
		t.Error("NewRelay(nil outbox) = nil error")
	}
	if _, err := outbox.NewRelay(o, nil, nil); err == nil {
		t.Error("NewRelay(nil publisher) = nil error")
	}
	r, err := outbox.NewRelay(o, outbox.PublisherFunc(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Wake()
	r.Wake() // never blocks, with or without Run
}

func TestSchema(t *testing.T) {
	for _, d := range []sqldialect.Dialect{sqldialect.Postgres, sqldialect.MySQL, sqldialect.SQLite} {
		stmts, err := outbox.Schema(d, "events_out")
		if err != nil || len(stmts) == 0 {
			t.Fatalf("Schema(%v) = %v, %v", d, stmts, err)
		}
		if !strings.Contains(stmts[0], "CREATE TABLE IF NOT EXISTS events_out") {
			t.Errorf("Schema(%v)[0] = %s; want the table created if missing", d, stmts[0])
		}
		for _, s := range stmts {
			if !strings.Contains(s, "IF NOT EXISTS") {
				t.Errorf("Schema(%v): %s is not IF NOT EXISTS: Migrate must be safe to run again", d, s)
			}
		}
	}
	if _, err := outbox.Schema(sqldialect.Postgres, "1bad"); err == nil {
		t.Error("Schema with a bad table name = nil error")
	}
}
