// Package idemzero is the go-zero adapter of idempotency.Guard: the
// Idempotency-Key checks of package idempotency as a rest.Middleware.
//
// Use it on the server, for every route:
//
//	server.Use(idemzero.New(idempotency.Config{Store: store}))
//
// or on some routes only:
//
//	server.AddRoutes(rest.WithMiddleware(idemzero.New(cfg), routes...))
//
// go-zero serves net/http handlers, so the middleware is
// idempotency.Middleware: the handler runs with its answer buffered, so
// that what is stored is exactly what is sent; a retry with the same key
// gets that answer byte for byte, with Idempotent-Replayed: true, and the
// handler does not run. The handler's request carries the keyed request's
// context (idempotency.FromContext(r.Context()) returns its Call) and a
// body that can be read again; httpx.Parse and pathvar.Vars work on it as
// usual. A handler that panics frees the key, then the panic goes on to
// go-zero's RecoverHandler, which answers 500.
package idemzero

import (
	"github.com/zeromicro/go-zero/rest"

	"github.com/onceguard/onceguard/idempotency"
)

// New returns go-zero middleware that guards the handlers it wraps with
// the Guard of cfg; the hooks of cfg get the *http.Request. It panics
// where idempotency.NewGuard does.
func New(cfg idempotency.Config) rest.Middleware {
	return rest.ToMiddleware(idempotency.Middleware(cfg))
}
