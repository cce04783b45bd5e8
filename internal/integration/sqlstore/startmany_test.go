package sqlstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// StartManyCTE creates many Deferred records in one caller's statement: each row's record,
// unless its key has one, with its window entry claimed unless a live one is another's; the
// rows started are those with both. A record started there is in flight under its lease (a
// duplicate Begin sees it in progress) and its window entry is its own. A window entry a live
// record holds, and a key with a record, start nothing; an expired entry is taken over. Other
// dialects refuse it.
func TestStartManyCTE(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db := d.store(t)
			ctx := context.Background()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if d.dialect != sqldialect.Postgres {
				if _, err := s.StartManyCTE("rows", 1, now); err == nil {
					t.Error("StartManyCTE on", d.name, "= nil error; want refused")
				}
				return
			}
			const n = 5
			p := fmt.Sprint("startmany-", now.UnixNano(), "-")
			ids, wins, owners := make([]string, n), make([]*string, n), make([]*string, n)
			for i := range n {
				ids[i] = fmt.Sprint(p, i)
				if i != 4 { // row 4: no window
					w, o := fmt.Sprint(p, "win-", i), idemstore.WindowOwner(ids[i], "a1")
					wins[i], owners[i] = &w, &o
				}
			}
			// Row 1's key has a record; row 2's window is held by another live record; row 3's
			// by one whose entry expired.
			if _, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[1], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}); err != nil {
				t.Fatal(err)
			}
			if left, err := s.ClaimWindow(ctx, *wins[2], "other/a1", time.Minute, now); err != nil || left != 0 {
				t.Fatal(left, err)
			}
			if left, err := s.ClaimWindow(ctx, *wins[3], "old/a1", time.Second, now.Add(-time.Minute)); err != nil || left != 0 {
				t.Fatal(left, err)
			}
			us := func(t time.Time) int64 { return t.UnixMicro() }
			leases, leaseUntil, expires, until := make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
			for i := range n {
				leases[i], leaseUntil[i], expires[i], until[i] = "lease-"+ids[i], us(now.Add(time.Minute)), us(now.Add(time.Hour)), us(now.Add(10*time.Second))
			}
			cte, err := s.StartManyCTE("mine", 9, now)
			if err != nil {
				t.Fatal(err)
			}
			q := `WITH mine AS (
  SELECT t.*, 'fp' AS fingerprint, NULL::text AS token_hash FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::int8[])
    AS t(id, lease, lease_until, expires_at, win_id, win_owner, win_until) WHERE $8::int = 1
), ` + cte.With + `
SELECT id FROM ` + cte.Result
			rows, err := db.QueryContext(ctx, q, append([]any{ids, leases, leaseUntil, expires, wins, owners, until, 1}, cte.Args...)...)
			started := sortedIDs(t, rows, err)
			if want := []string{ids[0], ids[3], ids[4]}; !slices.Equal(started, want) {
				t.Errorf("started %v; want %v", started, want)
			}
			for _, i := range []int{0, 3, 4} {
				res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
				if err != nil || res.Outcome != idemstore.InProgress {
					t.Errorf("Begin of started row %d = %+v, %v; want in progress", i, res, err)
				}
			}
			for _, i := range []int{0, 3} { // their entries are theirs: a duplicate under a new key is turned away
				if left, err := s.ClaimWindow(ctx, *wins[i], "dup/a1", time.Minute, now); err != nil || left == 0 {
					t.Errorf("ClaimWindow of row %d's entry by another = %v, %v; want held", i, left, err)
				}
			}
		})
	}
}
