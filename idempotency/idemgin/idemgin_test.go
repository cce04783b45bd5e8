package idemgin_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A native gin chain: the last status set before the body wins, as in
// gin; the handler's writer reports gin's Status, Size and Written; a
// handler after the guard's refusal never runs; the Call is in
// c.Request's context, and in c's with ContextWithFallback.
func TestGinHandlers(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	var runs atomic.Int32
	var seen struct{ status, size int }
	r := gin.New()
	r.ContextWithFallback = true // so that c itself, as a context.Context, has the Call too
	r.POST("/payments", idemgin.New(options(config{Store: &memstore.Store{}})), func(c *gin.Context) {
		c.Next()
		seen.status, seen.size = c.Writer.Status(), c.Writer.Size() // as a logging middleware reads them
	}, func(c *gin.Context) {
		runs.Add(1)
		if _, ok := idempotency.FromContext(c.Request.Context()); !ok {
			c.String(http.StatusInternalServerError, "no call in c.Request's context")
			return
		}
		if _, ok := idempotency.FromContext(c); !ok {
			c.String(http.StatusInternalServerError, "no call in c's context (ContextWithFallback)")
			return
		}
		if c.Writer.Written() || c.Writer.Size() != -1 {
			c.String(http.StatusInternalServerError, "written before the handler wrote")
			return
		}
		c.Status(http.StatusAccepted)                 // overridden, as in gin
		c.JSON(http.StatusCreated, gin.H{"id": "p1"}) // 201 {"id":"p1"}
	})
	url := serve(t, r)

	first, b1 := post(t, url, "k1", `{}`)
	if first == nil || first.StatusCode != http.StatusCreated || b1 != `{"id":"p1"}` {
		t.Fatalf("first = %v %s; want 201 {\"id\":\"p1\"}", first, b1)
	}
	if seen.status != http.StatusCreated || seen.size != len(b1) {
		t.Errorf("c.Writer after the handler: Status %d, Size %d; want 201, %d", seen.status, seen.size, len(b1))
	}
	again, b2 := post(t, url, "k1", `{}`)
	if again == nil || again.StatusCode != http.StatusCreated || b2 != b1 || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %v %s; want the first answer, replayed", again, b2)
	}
	if resp, _ := post(t, url, "", `{}`); resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no key = %v; want 400", resp)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
}
