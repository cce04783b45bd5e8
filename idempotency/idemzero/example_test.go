package idemzero_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemzero"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// handler runs once.
func Example() {
	var c rest.RestConf
	if err := conf.FillDefault(&c); err != nil { // go-zero's defaults: Recover, Timeout, MaxBytes, ...
		panic(err)
	}
	c.Log.Mode, c.Log.Stat = "console", false
	c.DevServer.Enabled = false // on by default: a pprof and metrics server on :6060
	server := rest.MustNewServer(c)
	logx.Disable() // after MustNewServer, whose SetUp starts logging
	server.Use(idemzero.New(idempotency.Config{
		Store:     &memstore.Store{},
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }, // keys are per user
	}))
	runs := 0
	server.AddRoute(rest.Route{Method: http.MethodPost, Path: "/payments", Handler: func(w http.ResponseWriter, r *http.Request) {
		runs++
		call, _ := idempotency.FromContext(r.Context())
		httpx.WriteJsonCtx(r.Context(), w, http.StatusCreated, map[string]any{"payment_id": fmt.Sprint("p", runs), "recovered": call.Recovered})
	}})
	h, err := rest.NewServerless(server) // server.Start() listens on c.Host:c.Port instead
	if err != nil {
		panic(err)
	}

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		h.Serve(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed="+w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"payment_id":"p1","recovered":false} replayed=
	// 201 {"payment_id":"p1","recovered":false} replayed=true
	// handler runs: 1
}
