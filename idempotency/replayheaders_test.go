package idempotency_test

import (
	"net/http"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// ReplayHeaders "*" never stores Set-Cookie, nor a hop-by-hop header,
// whatever the case of the name the handler used: net/http writes a
// non-canonical key as it is, and a client reads header names without
// regard to case, so h["set-cookie"] is a cookie on the wire.
func TestReplayAllHeadersAnyCase(t *testing.T) {
	c := &counting{status: 200, header: http.Header{
		"set-cookie": {"session=secret"}, "connection": {"x-hop"}, "X-Hop": {"1"}, "date": {"Mon, 01 Jan 2024 00:00:00 GMT"},
		"X-Kept": {"yes"},
	}}
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, ReplayHeaders: []string{"*"}})(c)
	send(h, "k", "", `{}`)
	w := send(h, "k", "", `{}`)
	if w.Header().Get("Idempotent-Replayed") != "true" || w.Header().Get("X-Kept") != "yes" {
		t.Fatalf("not a replay with X-Kept: %v", w.Header())
	}
	for k := range w.Header() {
		switch http.CanonicalHeaderKey(k) {
		case "Set-Cookie", "Connection", "X-Hop", "Date":
			t.Errorf("the replay carries %s: %v", k, w.Header())
		}
	}
}
