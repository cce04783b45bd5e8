// Package idemkratos is the Kratos (v2) adapter of idempotency.Guard: the
// Idempotency-Key checks of package idempotency as an HTTP filter of the
// kratos HTTP transport.
//
// Use it on the server, for every route:
//
//	srv := khttp.NewServer(khttp.Filter(idemkratos.Filter(idempotency.Config{Store: store})))
//
// or on the routes of one router, or one route, only:
//
//	r := srv.Route("/payments", idemkratos.Filter(cfg))
//	srv.Route("/").POST("/withdrawals", withdraw, idemkratos.Filter(cfg))
//
// A kratos HTTP filter is func(http.Handler) http.Handler, so the filter is
// idempotency.Middleware: the routes run with their answer buffered, so
// that what is stored is exactly what the response encoder wrote; a retry
// with the same key gets that answer byte for byte, with
// Idempotent-Replayed: true, and the route does not run. The request
// carries the keyed request's context, so idempotency.FromContext works in
// the route's handler and in the service method a generated route calls
// (kratos derives the transport's context from it), and a body that the
// route's decoder reads again. A route that panics frees the key, then the
// panic goes on: from a plain handler to net/http, which drops the
// connection; kratos' recovery middleware, in a generated route that uses
// it, turns a service method's panic into a 500 first, which frees the key
// as any 5xx does.
//
// There is no kratos middleware.Middleware: it runs on the decoded
// request and the reply before they are encoded, so it cannot store or
// replay the answer byte for byte.
package idemkratos

import (
	khttp "github.com/go-kratos/kratos/v2/transport/http"

	"github.com/onceguard/onceguard/idempotency"
)

// Filter returns a kratos HTTP filter that guards the routes behind it
// with the Guard of cfg; the hooks of cfg get the *http.Request. It panics
// where idempotency.NewGuard does.
func Filter(cfg idempotency.Config) khttp.FilterFunc {
	return idempotency.Middleware(cfg)
}
