package memstore

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// A completed answer's header comes back as http.Header.Clone would copy
// it: nil stays nil, names without values keep their nil or empty values,
// several values keep their order; what the caller does to the header it
// completed with afterwards does not reach the store. Replays share one
// read-only Record.
func TestHeaderKept(t *testing.T) {
	ctx, now := t.Context(), time.Now()
	for i, h := range []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"Content-Type": {"a"}, "Location": {"/x"}},
		{"A": {"1", "2", "3"}, "B": {"4"}, "C": nil, "D": {}, "E": {""}},
		{"A": {"1"}, "B": {"2"}, "C": {"3"}, "D": {"4"}, "E": {"5"}, "F": {"6"}, "G": {"7"}, "H": {"8"}, "I": {"9"}},
	} {
		s := &Store{}
		id := idempotency.RecordID(idempotency.Scope{}, fmt.Sprint(i))
		req := idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}
		res, _ := s.Begin(ctx, req)
		in := h.Clone()
		if err := s.Complete(ctx, id, res.Lease, idemstore.Response{Status: 201, Header: in, Body: []byte("b")}, now); err != nil {
			t.Fatal(err)
		}
		for k := range in { // the caller's header is the caller's
			if len(in[k]) > 0 {
				in[k][0] = "changed"
			}
			in[k] = append(in[k], "added")
		}
		for range 2 {
			got, err := s.Begin(ctx, req)
			if err != nil || got.Outcome != idemstore.Replay {
				t.Fatalf("Begin = %+v, %v", got, err)
			}
			g := got.Record.Response.Header
			if !reflect.DeepEqual(g, h.Clone()) || (g == nil) != (h == nil) {
				t.Errorf("header %#v came back as %#v", h, g)
			}
			for k, v := range g {
				if (v == nil) != (h[k] == nil) {
					t.Errorf("%s: %#v came back as %#v", k, h[k], v)
				}
				if cap(v) != len(v) {
					t.Errorf("%s: %#v has room to append into: an append would write to the store", k, v)
				}
			}
		}
		if a, b := got1(t, s, req).Record, got1(t, s, req).Record; a != b {
			t.Errorf("two replays made two Records (%p, %p); want one, shared", a, b)
		}
		if got := got1(t, s, req).Record; got.ID != id || got.Fingerprint != "fp" || got.State != idemstore.Completed || got.Response.Status != 201 || string(got.Response.Body) != "b" {
			t.Errorf("record %+v", got)
		}
	}
}

func got1(t *testing.T, s *Store, req idemstore.BeginRequest) idemstore.BeginResult {
	res, err := s.Begin(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Records, tokens and windows past their time are dropped by the next
// write: memory stays bounded.
func TestPruned(t *testing.T) {
	s, ctx, now := &Store{}, t.Context(), time.Now()
	for i := range 100 {
		id := idempotency.RecordID(idempotency.Scope{}, fmt.Sprint(i))
		res, _ := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Second, TTL: time.Minute, Now: now})
		if i%2 == 0 {
			_ = s.Complete(ctx, id, res.Lease, idemstore.Response{Status: 200}, now)
		}
		_, _ = s.ClaimWindow(ctx, id, "o", time.Minute, now)
	}
	if r, _, w := s.Len(); r != 100 || w != 100 {
		t.Fatalf("Len = %d records, %d windows; want 100, 100", r, w)
	}
	_, _ = s.ClaimWindow(ctx, "x", "o", time.Minute, now.Add(2*time.Minute))
	if r, _, w := s.Len(); r != 0 || w != 1 {
		t.Errorf("after the TTL: %d records, %d windows; want 0, 1", r, w)
	}
}

// A sweep drops an entry only if its own time has come: a token bound
// (kept as long as its record) outlives its first deadline, and a window
// entry claimed again after it expired outlives the old entry's deadline.
func TestSweepKeepsExtended(t *testing.T) {
	s, ctx, now := &Store{}, t.Context(), time.Now()
	if err := s.PutToken(ctx, token.Record{Hash: "h", Subject: "u", Purpose: "p", ExpiresAt: now.Add(5 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	claim := &idemstore.TokenClaim{Hash: "h", Subject: "u", Purpose: "p", Scope: "s"}
	if _, err := s.Begin(ctx, idemstore.BeginRequest{ID: "r", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim, Now: now}); err != nil {
		t.Fatal(err)
	}
	// Windows: a claimed at now for 10s; b takes it over once it expired.
	if left, _ := s.ClaimWindow(ctx, "w", "a", 10*time.Second, now); left != 0 {
		t.Fatalf("first claim left %v", left)
	}
	if left, _ := s.ClaimWindow(ctx, "w", "b", 10*time.Second, now.Add(10500*time.Millisecond)); left != 0 {
		t.Fatalf("claim after expiry left %v", left)
	}
	// Past the token's and a's deadlines (the sweep runs on this write).
	later := now.Add(12 * time.Second)
	if left, _ := s.ClaimWindow(ctx, "w", "c", 10*time.Second, later); left <= 0 {
		t.Errorf("claim inside b's window = %v left; want > 0 (b's entry swept by a's deadline?)", left)
	}
	if _, err := s.Begin(ctx, idemstore.BeginRequest{ID: "x", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now.Add(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.GetToken(ctx, "h"); err != nil || rec.Scope != "s" {
		t.Errorf("bound token after its first deadline = %+v, %v; want kept, bound to s", rec, err)
	}
}

// A taken-over record answers to the new lease only, and keeps it once
// completed no more: the crashed holder's lease never matches again.
func TestTakeOverLease(t *testing.T) {
	var s Store
	ctx := t.Context()
	now := time.Unix(1_700_000_000, 0)
	req := idemstore.BeginRequest{ID: "a", Fingerprint: "f", Lease: time.Second, TTL: time.Hour, Now: now}
	first, err := s.Begin(ctx, req)
	if err != nil || first.Outcome != idemstore.Started {
		t.Fatalf("first Begin: %+v, %v", first, err)
	}
	req.Now = now.Add(2 * time.Second)
	second, err := s.Begin(ctx, req)
	if err != nil || second.Outcome != idemstore.Started || !second.Recovered || second.Lease == first.Lease {
		t.Fatalf("Begin after the lease: %+v, %v; want a take-over with a new lease", second, err)
	}
	resp := idemstore.Response{Status: 201, Body: []byte("x")}
	if err := s.Complete(ctx, "a", first.Lease, resp, req.Now); err != idempotency.ErrLeaseLost {
		t.Fatalf("Complete with the crashed holder's lease: %v; want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, "a", second.Lease, resp, req.Now); err != nil {
		t.Fatalf("Complete with the new lease: %v", err)
	}
	if err := s.Complete(ctx, "a", second.Lease, resp, req.Now); err != idempotency.ErrLeaseLost {
		t.Fatalf("Complete again: %v; want ErrLeaseLost", err)
	}
	got, err := s.Begin(ctx, req)
	if err != nil || got.Outcome != idemstore.Replay || got.Record.Lease != "" || string(got.Record.Response.Body) != "x" {
		t.Fatalf("Begin after completion: %+v, %v; want a replay of x without a lease", got, err)
	}
}
