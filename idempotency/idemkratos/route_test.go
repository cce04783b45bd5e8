package idemkratos_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	khttp "github.com/go-kratos/kratos/v2/transport/http"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemkratos"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// On one route only: the guarded route needs a key and replays; the
// server's other routes do not see the guard.
func TestRouteFilter(t *testing.T) {
	srv := khttp.NewServer()
	runs := 0
	srv.Route("/").POST("/payments", func(ctx khttp.Context) error {
		runs++
		if _, ok := idempotency.FromContext(ctx); !ok {
			return ctx.String(http.StatusInternalServerError, "no call")
		}
		return ctx.String(http.StatusCreated, "paid")
	}, idemkratos.Filter(options(config{Store: &memstore.Store{}})))
	srv.Route("/").POST("/search", func(ctx khttp.Context) error { return ctx.String(http.StatusOK, "found") })

	send := func(path, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}
	if w := send("/search", ""); w.Code != http.StatusOK || w.Body.String() != "found" {
		t.Errorf("unguarded route = %d %q; want 200 found", w.Code, w.Body)
	}
	if w := send("/payments", ""); w.Code != http.StatusBadRequest {
		t.Errorf("guarded route without a key = %d %q; want 400", w.Code, w.Body)
	}
	first, again := send("/payments", "k1"), send("/payments", "k1")
	if first.Code != http.StatusCreated || first.Body.String() != "paid" || again.Code != http.StatusCreated ||
		again.Body.String() != "paid" || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("guarded route: %d %q then %d %q %v; want 201 paid, then its replay", first.Code, first.Body, again.Code, again.Body, again.Header())
	}
	if runs != 1 {
		t.Errorf("guarded route ran %d times; want 1", runs)
	}
}
