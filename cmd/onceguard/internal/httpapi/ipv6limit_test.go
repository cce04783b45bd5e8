package httpapi_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// One IPv6 host has a /64 of addresses to send from: the sign-in limits
// count the prefix, not each address, or every guess comes from a fresh
// address (which the username's limit spares) and none is ever refused.
func TestSignInLimitsIPv6Prefix(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	refused := 0
	for i := range 30 {
		r := httptest.NewRequest("POST", "/api/v1/sessions", strings.NewReader(`{"username":"alice","password":"guess number `+fmt.Sprint(i)+`"}`))
		r.Header.Set("Content-Type", "application/json")
		r.RemoteAddr = fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1)
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		if w.Code == 429 {
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("30 wrong passwords for alice from one /64, each from its own address: none refused; want 429 too_many_attempts after 5 (the pair's limit)")
	}
}
