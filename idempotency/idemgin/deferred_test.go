package idemgin_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// Options.Deferred is net/http only (docs/idempotency.md); an adapter that
// does not call Guard.Resume must refuse it, not answer a refused
// (duplicate) request with the handler's empty 200.
func TestDeferredNotSilentlyAccepted(t *testing.T) {
	gin.SetMode(gin.TestMode)
	defer func() { _ = recover() }() // refusing the option at New is a fix too
	r := gin.New()
	runs := 0
	r.POST("/pay", idemgin.New(idempotency.Options[*gin.Context]{Store: &memstore.Store{}, Deferred: true}), func(c *gin.Context) {
		runs++
		call, _ := idempotency.FromContext(c.Request.Context())
		if runs == 1 && call.Refused(idemstore.ErrKeyTaken) { // the store says the key has a record
			return // as documented: write nothing, the middleware answers
		}
		c.String(http.StatusCreated, "paid")
	})
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	if w.Code == http.StatusOK && w.Body.Len() == 0 {
		t.Fatalf("a refused Deferred call was answered an empty 200 (runs %d): no replay, no 409, no second run", runs)
	}
}
