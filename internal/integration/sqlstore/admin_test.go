package sqlstore_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/token"
)

// Inspect shows a record as stored; Resolve with no answer frees it (and
// its token: the key and token run again), with an answer stores it (the
// key replays it), taking the lease from a holder still in flight.
func TestInspectResolve(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, _ := d.store(t)
			ctx, now := context.Background(), time.Now()
			id := "admin-" + d.name + "-" + now.Format(time.RFC3339Nano)
			if _, err := s.Inspect(ctx, id); !errors.Is(err, sqlstore.ErrNoRecord) {
				t.Fatalf("Inspect of nothing = %v; want ErrNoRecord", err)
			}
			if _, err := s.Resolve(ctx, id, nil); !errors.Is(err, sqlstore.ErrNoRecord) {
				t.Fatalf("Resolve of nothing = %v; want ErrNoRecord", err)
			}
			tokens := token.New(s, nil)
			is, err := tokens.Issue(ctx, "alice", "withdrawal")
			if err != nil {
				t.Fatal(err)
			}
			claim := &idemstore.TokenClaim{Hash: token.Hash(is.Token), Subject: "alice", Purpose: "withdrawal", Scope: "scope-1"}
			begin := func() idemstore.BeginResult {
				t.Helper()
				res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim, Now: time.Now()})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			first := begin()
			rec, err := s.Inspect(ctx, id)
			if err != nil || rec.State != idemstore.InFlight || rec.Fingerprint != "fp" || rec.TokenHash != claim.Hash || rec.Response != nil || !rec.LeaseUntil.After(now) {
				t.Fatalf("Inspect in flight = %+v, %v; want in flight with its token and lease", rec, err)
			}
			// Answered by hand while in flight: the holder lost its key.
			before, err := s.Resolve(ctx, id, &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":7}`)})
			if err != nil || before.State != idemstore.InFlight {
				t.Fatalf("Resolve answer = %+v, %v", before, err)
			}
			if err := s.Complete(ctx, id, first.Lease, idemstore.Response{Status: 500}, time.Now()); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("the old holder's Complete = %v; want ErrLeaseLost", err)
			}
			res := begin()
			if res.Outcome != idemstore.Replay || res.Record.Response.Status != 201 || string(res.Record.Response.Body) != `{"id":7}` ||
				res.Record.Response.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("Begin after the answer = %+v; want the replay of 201 {\"id\":7}", res)
			}
			// Freed by hand: the key (and its token) start again.
			if _, err := s.Resolve(ctx, id, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Inspect(ctx, id); !errors.Is(err, sqlstore.ErrNoRecord) {
				t.Errorf("Inspect after freeing = %v; want ErrNoRecord", err)
			}
			if tr, err := s.GetToken(ctx, claim.Hash); err != nil || tr.Scope != "" {
				t.Errorf("token after freeing = %+v, %v; want unbound", tr, err)
			}
			if res := begin(); res.Outcome != idemstore.Started || res.Recovered {
				t.Errorf("Begin after freeing = %+v; want a fresh start", res)
			}
		})
	}
}
