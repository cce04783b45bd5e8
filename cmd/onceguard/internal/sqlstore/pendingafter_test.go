package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/sqldialect"
)

// PendingAfter pages through the backlog in its order (created_at, then id), on every
// database: the reconciler goes on where its last pass stopped. Each database is a fresh one
// of this test's own.
func TestPendingAfter(t *testing.T) {
	opens := []struct {
		name string
		d    sqldialect.Dialect
		open func(t *testing.T) *sql.DB
	}{
		{"postgres", sqldialect.Postgres, func(t *testing.T) *sql.DB {
			return dbtest.OpenPostgres(t, dbtest.FreshPostgres(t, "og_pending_after"))
		}},
		{"mysql", sqldialect.MySQL, func(t *testing.T) *sql.DB {
			db, err := sql.Open("mysql", dbtest.FreshMySQL(t, "og_pending_after"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return db
		}},
		{"sqlite", sqldialect.SQLite, func(t *testing.T) *sql.DB { return dbtest.SQLite(t) }},
	}
	for _, o := range opens {
		t.Run(o.name, func(t *testing.T) {
			ctx := context.Background()
			db := o.open(t)
			if err := sqlstore.Migrate(ctx, db, o.d); err != nil {
				t.Fatal(err)
			}
			s := sqlstore.Open(db, o.d)
			now := time.Now().UnixMicro()
			if err := s.CreateUser(ctx, app.User{ID: "u1", Username: "alice", PasswordHash: "h", CreatedAt: time.UnixMicro(now)}, "CNY"); err != nil {
				t.Fatal(err)
			}
			// d0..d4, d1 and d2 at the same microsecond; d3 settled.
			at := []int64{0, 1, 1, 2, 3}
			for i, a := range at {
				id := fmt.Sprintf("d%d", i)
				if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: id, UserID: "u1", Key: id, Amount: 100, CreatedAt: time.UnixMicro(now + a)}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.SettleDeposit(ctx, "d3", true, time.UnixMicro(now)); err != nil {
				t.Fatal(err)
			}
			var pages []string
			after := app.PendingCursor{}
			for range 4 {
				got, err := s.PendingAfter(ctx, app.Deposit, after, 2)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, m := range got {
					ids = append(ids, m.ID)
				}
				pages = append(pages, strings.Join(ids, ","))
				if len(got) == 0 {
					break
				}
				last := got[len(got)-1]
				after = app.PendingCursor{CreatedAt: last.CreatedAt, ID: last.ID}
			}
			if got, want := strings.Join(pages, " | "), "d0,d1 | d2,d4 | "; got != want {
				t.Errorf("pages = %q; want %q", got, want)
			}
		})
	}
}
