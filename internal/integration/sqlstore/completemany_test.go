package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/sqldialect"
)

// CompleteManyCTE completes many records in one caller's statement: each row of the caller's
// relation whose lease still holds its record, and only those; the records then replay the
// answers ResponseColumns encoded, as Complete stores them. A row of another lease, or of a
// record completed before or never begun, completes nothing. Other dialects refuse it.
func TestCompleteManyCTE(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db := d.store(t)
			ctx := context.Background()
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if d.dialect != sqldialect.Postgres {
				if _, err := s.CompleteManyCTE("rows", 1); err == nil {
					t.Error("CompleteManyCTE on", d.name, "= nil error; want refused")
				}
				return
			}
			now := time.Now()
			ids, leases := make([]string, 4), make([]string, 4)
			for i := range 3 {
				ids[i] = fmt.Sprint("many-", now.UnixNano(), "-", i)
				res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
				if err != nil || res.Outcome != idemstore.Started {
					t.Fatalf("Begin(%s) = %+v, %v", ids[i], res, err)
				}
				leases[i] = res.Lease
			}
			ids[3], leases[3] = fmt.Sprint("many-", now.UnixNano(), "-never"), "x"
			leases[2] = "another lease"
			resps := make([]idemstore.Response, 4)
			statuses, headers, bodies := make([]int32, 4), make([]string, 4), make([][]byte, 4)
			for i := range resps {
				resps[i] = idemstore.Response{Status: 201 + i, Header: http.Header{"Content-Type": {"application/json"}, "X-N": {fmt.Sprint(i)}}, Body: fmt.Appendf(nil, `{"n":%d}`, i)}
				status, header, body, err := sqlstore.ResponseColumns(resps[i])
				if err != nil {
					t.Fatal(err)
				}
				statuses[i], headers[i], bodies[i] = int32(status), header, body
			}
			cte, err := s.CompleteManyCTE("mine", 6)
			if err != nil {
				t.Fatal(err)
			}
			q := `WITH mine AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::bytea[]) AS t(id, lease, status, header, body)
), ` + cte.With + `
SELECT id FROM ` + cte.Result
			completed := func() []string {
				t.Helper()
				rows, err := db.QueryContext(ctx, q, append([]any{ids, leases, statuses, headers, bodies}, cte.Args...)...)
				return sortedIDs(t, rows, err)
			}
			if got, want := completed(), []string{ids[0], ids[1]}; !slices.Equal(got, want) {
				t.Errorf("completed %v; want %v", got, want)
			}
			for i := range 2 {
				res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
				if err != nil || res.Outcome != idemstore.Replay {
					t.Fatalf("Begin(%s) after = %+v, %v; want a replay", ids[i], res, err)
				}
				r := res.Record.Response
				if r.Status != resps[i].Status || string(r.Body) != string(resps[i].Body) || r.Header.Get("X-N") != fmt.Sprint(i) || r.Header.Get("Content-Type") != "application/json" {
					t.Errorf("record %d replays %d %v %q; want %d %v %q", i, r.Status, r.Header, r.Body, resps[i].Status, resps[i].Header, resps[i].Body)
				}
			}
			res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[2], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
			if err != nil || res.Outcome != idemstore.InProgress {
				t.Errorf("Begin of the record another lease named = %+v, %v; want still in progress", res, err)
			}
			// Completed once: the same statement again completes nothing.
			if got := completed(); len(got) != 0 {
				t.Errorf("completed again: %v; want none", got)
			}
			if err := s.Complete(ctx, ids[0], leases[0], resps[0], now); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("Complete of a record CompleteManyCTE completed = %v; want ErrLeaseLost", err)
			}
		})
	}
}

// sortedIDs returns the one text column of rows, a query's result with its error err, sorted.
func sortedIDs(t *testing.T, rows *sql.Rows, err error) []string {
	t.Helper()
	out := dbtest.Strings(t, rows, err)
	slices.Sort(out)
	return out
}
