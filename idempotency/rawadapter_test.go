package idempotency_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// The collector makes names canonical, drops Content-Length, keeps a
// second Set-Cookie, and copies what it is given (a stack reuses its
// buffers).
func TestHeaderCollector(t *testing.T) {
	c := idempotency.NewHeaderCollector()
	defer c.Release()
	v := []byte("application/json")
	c.Add([]byte("content-type"), v)
	c.Add([]byte("Content-Length"), []byte("2"))
	c.Add([]byte("Set-Cookie"), []byte("a=1"))
	c.Add([]byte("Set-Cookie"), []byte("b=2"))
	c.Add([]byte("x-request-id"), []byte("r1"))
	copy(v, "XXXXXXXXXXXXXXXX")
	want := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}, "X-Request-Id": {"r1"}}
	got := c.Header()
	if len(got) != len(want) {
		t.Fatalf("header = %v; want %v", got, want)
	}
	for k, vs := range want {
		if !slices.Equal(got[k], vs) {
			t.Errorf("%s = %q; want %q", k, got[k], vs)
		}
	}
	if a := c.Answer(http.StatusOK, nil); a.Written || a.Status != http.StatusOK || len(a.Header) != 3 {
		t.Errorf("Answer(200, nil) = %+v; want not written, the collected header", a)
	}
	if a := c.Answer(http.StatusNoContent, nil); !a.Written {
		t.Error("Answer(204, nil) not written")
	}
	if a := c.Answer(http.StatusOK, []byte("x")); !a.Written || string(a.Body) != "x" {
		t.Errorf("Answer(200, x) = %+v; want written, body x", a)
	}
}

// The usual names cost nothing: collecting two of them allocates only
// their two values.
func TestHeaderCollectorAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled values at random")
	}
	ct, loc := []byte("Content-Type"), []byte("Location")
	n := testing.AllocsPerRun(100, func() {
		c := idempotency.NewHeaderCollector()
		c.Add(ct, []byte("application/json"))
		c.Add(loc, []byte("/payments/1"))
		c.Release()
	})
	if n > 2 {
		t.Errorf("%v allocations per collected header; want at most 2 (the values)", n)
	}
}

// FirstExtra gives what FirstHeader adds and the answer lacks: no
// Cache-Control over the handler's own, without touching the answer.
func TestFirstExtra(t *testing.T) {
	g := idempotency.NewGuard(idempotency.Options[*http.Request]{Store: &memstore.Store{}, MarkFirst: true})
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

	c := idempotency.NewHeaderCollector()
	c.Add([]byte("Cache-Control"), []byte("private"))
	add := g.FirstExtra(c, exp)
	if _, ok := add["Cache-Control"]; ok || add.Get("Idempotent-Replayed") != "false" ||
		add.Get("Idempotency-Key-Expires") != exp.Format(http.TimeFormat) || len(add) != 2 {
		t.Errorf("with the handler's Cache-Control: %v; want Idempotent-Replayed and Idempotency-Key-Expires only", add)
	}
	if h := c.Header(); len(h) != 1 || h.Get("Cache-Control") != "private" {
		t.Errorf("answer header = %v; want Cache-Control: private only", h)
	}
	c.Release()

	c = idempotency.NewHeaderCollector()
	defer c.Release()
	if add := g.FirstExtra(c, time.Time{}); add.Get("Cache-Control") != "no-store" || len(add) != 2 {
		t.Errorf("without: %v; want Cache-Control: no-store and Idempotent-Replayed", add)
	}
}

// RawRequest copies what the Guard keeps, cuts the body at MaxBody+1,
// and keeps the Content-Type only without a key header.
func TestRawRequest(t *testing.T) {
	g := idempotency.NewGuard(idempotency.Options[*http.Request]{Store: &memstore.Store{}, MaxBody: 4})
	method, path, key, ct, body := []byte("POST"), []byte("/p/1"), []byte("k1"), []byte("application/json"), []byte("123456")
	r := g.RawRequest(method, path, [][]byte{key}, ct, body)
	copy(path, "XXXX")
	copy(key, "XX")
	copy(body, "XXXXXX")
	if r.Method != "POST" || r.Path != "/p/1" || !slices.Equal(r.Key, []string{"k1"}) || r.ContentType != "" || string(r.Body) != "12345" {
		t.Errorf("with a key: %+v; want POST /p/1 [k1], no Content-Type, body 12345", r)
	}
	r = g.RawRequest([]byte("BREW"), path, nil, ct, nil)
	if r.Method != "BREW" || r.Key != nil || r.ContentType != "application/json" || r.Body == nil || len(r.Body) != 0 {
		t.Errorf("without: %+v; want BREW, no key, the Content-Type, an empty body", r)
	}
}
