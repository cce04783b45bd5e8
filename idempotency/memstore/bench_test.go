package memstore_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// The store's part of a first use (Begin, Complete) and of a replay
// (Begin), with ids as Middleware makes them.
func BenchmarkBeginComplete(b *testing.B) {
	s, ctx, now := &memstore.Store{}, context.Background(), time.Now()
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = idempotency.RecordID(idempotency.Scope{Method: "POST", Path: "/withdrawals"}, "key-"+string(rune('a'+i%26))+time.Duration(i).String())
	}
	resp := idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"1"}`)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
		if err != nil || res.Outcome != idemstore.Started {
			b.Fatal(res, err)
		}
		if err := s.Complete(ctx, ids[i], res.Lease, resp, now); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s, ctx, now := &memstore.Store{}, context.Background(), time.Now()
	id := idempotency.RecordID(idempotency.Scope{Method: "POST", Path: "/withdrawals"}, "same")
	req := idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}
	res, _ := s.Begin(ctx, req)
	_ = s.Complete(ctx, id, res.Lease, idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"1"}`)}, now)
	b.ReportAllocs()
	for b.Loop() {
		if res, err := s.Begin(ctx, req); err != nil || res.Outcome != idemstore.Replay {
			b.Fatal(res, err)
		}
	}
}
