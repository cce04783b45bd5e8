package httpapi

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

// The client's scheme comes from the connection, else from a proxy's
// X-Forwarded-Proto or Forwarded; with neither it is unknown (and the
// session cookie is not marked Secure, the CSRF check compares hosts only).
func TestRequestScheme(t *testing.T) {
	for _, tc := range []struct {
		name, xfp, fwd string
		tls            bool
		scheme         string
		known          bool
	}{
		{name: "plain, no proxy headers"},
		{name: "TLS connection", tls: true, scheme: "https", known: true},
		{name: "X-Forwarded-Proto https", xfp: "https", scheme: "https", known: true},
		{name: "X-Forwarded-Proto, first of a list", xfp: "HTTP, https", scheme: "http", known: true},
		{name: "X-Forwarded-Proto nonsense", xfp: "gopher"},
		{name: "Forwarded proto", fwd: `for=192.0.2.1;proto=https;host=example.test`, scheme: "https", known: true},
		{name: "Forwarded quoted, first element", fwd: `proto="http", proto=https`, scheme: "http", known: true},
		{name: "Forwarded without proto", fwd: `for=192.0.2.1`},
		{name: "X-Forwarded-Proto before Forwarded", xfp: "http", fwd: "proto=https", scheme: "http", known: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "http://example.test/api/v1/deposits", nil)
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if tc.xfp != "" {
				r.Header.Set("X-Forwarded-Proto", tc.xfp)
			}
			if tc.fwd != "" {
				r.Header.Set("Forwarded", tc.fwd)
			}
			if scheme, known := requestScheme(r); scheme != tc.scheme || known != tc.known {
				t.Errorf("requestScheme = %q, %v; want %q, %v", scheme, known, tc.scheme, tc.known)
			}
			if got, want := secure(r), tc.scheme == "https"; got != want {
				t.Errorf("secure = %v; want %v", got, want)
			}
		})
	}
}
