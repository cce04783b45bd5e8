package sqlstore_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// A stored header is replayed as it was sent, byte for byte, as memstore
// does: a value with bytes that are not UTF-8 (obs-text, say a Latin-1
// filename), which net/http sends as they are.
func TestReplayHeaderBytes(t *testing.T) {
	for _, d := range databases[:3] {
		t.Run(d.name, func(t *testing.T) {
			s, _ := d.store(t)
			ctx, now := context.Background(), time.Now()
			id := idempotency.RecordID(idempotency.Scope{Principal: t.Name()}, now.String())
			req := idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now}
			res, err := s.Begin(ctx, req)
			if err != nil || res.Outcome != idemstore.Started {
				t.Fatalf("Begin = %+v, %v", res, err)
			}
			want := "attachment; filename=\"caf\xe9.txt\""
			if err := s.Complete(ctx, id, res.Lease, idemstore.Response{Status: 200, Header: http.Header{"Content-Disposition": {want}}, Body: []byte("x")}, now); err != nil {
				t.Fatal(err)
			}
			res, err = s.Begin(ctx, req)
			if err != nil || res.Outcome != idemstore.Replay {
				t.Fatalf("Begin = %+v, %v", res, err)
			}
			if got := res.Record.Response.Header.Get("Content-Disposition"); got != want {
				t.Errorf("replayed header = %q; want %q as stored", got, want)
			}
		})
	}
}
