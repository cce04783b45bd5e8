package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/outbox/outboxtest"
	"github.com/onceguard/onceguard/sqldialect"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m,
		leakcheck.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

var databases = []struct {
	name    string
	dialect sqldialect.Dialect
	open    func(t *testing.T) *sql.DB
}{
	{"postgres", sqldialect.Postgres, func(t *testing.T) *sql.DB { return dbtest.Postgres(t) }},
	{"mysql", sqldialect.MySQL, func(t *testing.T) *sql.DB { return dbtest.MySQL(t) }},
	{"sqlite", sqldialect.SQLite, func(t *testing.T) *sql.DB { return dbtest.SQLite(t) }},
}

func TestConformance(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			outboxtest.Run(t, d.open(t), d.dialect)
		})
	}
}

// Two processes migrating at once must not break each other.
func TestMigrateConcurrently(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			table := "outboxtest_migrate"
			_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					o, err := outbox.New(db, d.dialect, &outbox.Options{Table: table})
					if err == nil {
						err = o.Migrate(context.Background())
					}
					errs <- err
				}()
			}
			for range 4 {
				if err := <-errs; err != nil {
					t.Errorf("Migrate = %v", err)
				}
			}
		})
	}
}
