package httpapi

import (
	"slices"
	"testing"

	"github.com/onceguard/onceguard/idempotency/memstore"
)

// SECURITY.md says no route cancels or deletes a submit token, an
// Idempotency-Key, an order or a payment, so no user can cancel another's:
// the one route besides GET and POST is DELETE /api/v1/sessions/current,
// which ends the caller's own session. A new DELETE, PUT or PATCH route
// must come with its threat-model row and a cross-user test
// (cmd/onceguard TestServeNoCrossUserDelete).
func TestOnlyDeleteIsOwnSession(t *testing.T) {
	s := New(Config{Keys: &memstore.Store{}}).(*server)
	var other []string
	for path, methods := range s.routes {
		for m := range methods {
			if m != "GET" && m != "POST" {
				other = append(other, m+" "+path)
			}
		}
	}
	slices.Sort(other)
	if want := []string{"DELETE /api/v1/sessions/current"}; !slices.Equal(other, want) {
		t.Errorf("routes other than GET and POST: %q; want only %q (update SECURITY.md and its tests first)", other, want)
	}
}
