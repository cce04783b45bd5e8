package migrate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// Five processes (five pools) run the libraries' Migrate on a fresh
// database at once, several rounds.
func TestLibraryMigrateFivePools(t *testing.T) {
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(d, func(t *testing.T) {
			dialect := map[string]sqldialect.Dialect{"postgres": sqldialect.Postgres, "mysql": sqldialect.MySQL, "sqlite": sqldialect.SQLite}[d]
			dbs := dbtest.FreshPools(t, d, "onceguard_libmigrate_five", 5)
			for round := range 5 {
				prefix := fmt.Sprintf("r%d_", round)
				errs := make(chan error, 3*len(dbs))
				for _, db := range dbs {
					go func() {
						s, err := sqlstore.New(db, dialect, &sqlstore.Options{Prefix: prefix})
						if err == nil {
							err = s.Migrate(context.Background())
						}
						errs <- err
					}()
					go func() {
						b, err := sqllock.New(db, dialect, &sqllock.Options{Table: prefix + "locks"})
						if err == nil {
							err = b.Migrate(context.Background())
						}
						errs <- err
					}()
					go func() {
						o, err := outbox.New(db, dialect, &outbox.Options{Table: prefix + "outbox"})
						if err == nil {
							err = o.Migrate(context.Background())
						}
						errs <- err
					}()
				}
				for range 3 * len(dbs) {
					if err := <-errs; err != nil {
						t.Errorf("round %d: Migrate = %v", round, err)
					}
				}
			}
		})
	}
}
