//go:build !race

package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A first use costs the store two allocations (the record and its copy
// of the body; lease ids come in batches) and a replay none: the
// middleware's allocation bounds (TestMiddlewareAllocs) count on it.
func TestAllocs(t *testing.T) {
	const runs = 500
	s, ctx, now := &memstore.Store{}, context.Background(), time.Now()
	ids := make([]string, runs+1)
	for i := range ids {
		ids[i] = fmt.Sprintf("%064d", i)
	}
	resp := idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"1"}`)}
	i := 0
	first := testing.AllocsPerRun(runs, func() {
		res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
		if err != nil || res.Outcome != idemstore.Started {
			t.Fatalf("Begin = %+v, %v", res, err)
		}
		if err := s.Complete(ctx, ids[i], res.Lease, resp, now); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if first > 2 {
		t.Errorf("Begin and Complete: %v allocations; want at most 2", first)
	}
	req := idemstore.BeginRequest{ID: ids[0], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}
	replay := testing.AllocsPerRun(runs, func() {
		if res, err := s.Begin(ctx, req); err != nil || res.Outcome != idemstore.Replay {
			t.Fatalf("Begin = %+v, %v", res, err)
		}
	})
	if replay > 0 {
		t.Errorf("replay: %v allocations; want none", replay)
	}
}
