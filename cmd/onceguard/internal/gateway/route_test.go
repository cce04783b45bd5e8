package gateway

import "testing"

func TestRouteMatch(t *testing.T) {
	for _, tc := range []struct {
		route, method, path string
		want                bool
	}{
		{"POST /withdraw", "POST", "/withdraw", true},
		{"POST /withdraw", "GET", "/withdraw", false},
		{"POST /withdraw", "POST", "/withdraw/", false},
		{"POST /withdraw", "POST", "/withdraw/x", false},
		{"POST /orders/{id}/pay payment", "POST", "/orders/42/pay", true},
		{"POST /orders/{id}/pay payment", "POST", "/orders//pay", false},
		{"POST /orders/{id}/pay payment", "POST", "/orders/4/2/pay", false},
		{"POST /orders/{id}/pay payment", "POST", "/orders/42", false},
		{"POST /", "POST", "/", true},
	} {
		r, err := ParseRoute(tc.route)
		if err != nil {
			t.Fatalf("ParseRoute(%q) = %v", tc.route, err)
		}
		if got := r.Match(tc.method, tc.path); got != tc.want {
			t.Errorf("%q matches %s %s = %v; want %v", tc.route, tc.method, tc.path, got, tc.want)
		}
	}
	for _, bad := range []string{"", "POST", "post /x", "POST x", "POST /a{id}", "POST /x a b c", "POST /healthz", "POST /onceguard/v1/x", "POST /x bad!purpose"} {
		if _, err := ParseRoute(bad); err == nil {
			t.Errorf("ParseRoute(%q) succeeded; want an error", bad)
		}
	}
}

func TestFingerprint(t *testing.T) {
	fp := func(ct, body, field string) string {
		t.Helper()
		s, err := Fingerprint(ct, []byte(body), field)
		if err != nil {
			t.Fatalf("Fingerprint(%q, %q) = %v", ct, body, err)
		}
		return s
	}
	const form = "application/x-www-form-urlencoded"
	same := [][2]string{
		{fp(form, "a=1&b=2&withdraw_token=st_1", "withdraw_token"), fp(form, "b=2&withdraw_token=st_2&a=1", "withdraw_token")},
		{fp(form, "a=1&b=2", ""), fp(form+"; charset=UTF-8", "b=2&a=1", "")},
		{fp("application/json", `{"a":1,"t":"x"}`, "t"), fp("application/json", ` { "t" : "y", "a" : 1 } `, "t")},
		{fp("application/problem+json", `{"a":[1,2]}`, ""), fp("application/json", `{"a": [1, 2]}`, "")},
		{fp("text/plain", "", ""), fp("application/json", "  ", "")},
	}
	for i, p := range same {
		if p[0] != p[1] {
			t.Errorf("pair %d: %s != %s; want one fingerprint", i, p[0], p[1])
		}
	}
	differ := [][2]string{
		{fp(form, "a=1&a=2", ""), fp(form, "a=2&a=1", "")}, // a field's values keep their order
		{fp(form, "a=1", ""), fp("application/json", `{"a":"1"}`, "")},
		{fp("text/plain", "a=1", ""), fp(form, "a=1", "")},
		{fp("text/plain", "x ", ""), fp("text/plain", "x", "")}, // other types: the bytes
		{fp("application/json", `{"a":1,"t":"x"}`, ""), fp("application/json", `{"a":1,"t":"y"}`, "")},
	}
	for i, p := range differ {
		if p[0] == p[1] {
			t.Errorf("pair %d: both %s; want two fingerprints", i, p[0])
		}
	}
	if _, err := Fingerprint("application/json", []byte(`{"a":1,"a":2}`), ""); err == nil {
		t.Error("a member twice: no error; want invalid_json")
	}
	if _, err := Fingerprint(form, []byte("a=%zz"), ""); err == nil {
		t.Error("a bad form: no error; want invalid_request")
	}
}
