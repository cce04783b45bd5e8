package main

import (
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/redistest"
)

// With only the database black-holed, /readyz blames the database alone:
// each component is checked at once with its own deadline, so the
// database's hang leaves Redis and the provider their time to answer.
func TestServeReadyzOnlyDatabaseHangs(t *testing.T) {
	u, err := url.Parse(dbtest.FreshPostgres(t, "onceguard_e2e_readyz_hang"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	rdb := redistest.StartServer(t)
	provider := httptest.NewServer(psp.Handler(&psp.Sim{}))
	t.Cleanup(provider.Close)
	anon := &client{t: t, base: startServe(t, "--db", u.String(), "--redis", rdb.URL(), "--psp", provider.URL)}
	t.Cleanup(func() { _ = p.Heal() }) // before the service stops
	r := anon.do("GET", "/readyz", "", "")
	if c, _ := r.body["components"].(map[string]any); r.status != 200 || r.body["status"] != "ok" || c["redis"] != "ok" || c["provider"] != "ok" {
		t.Fatalf("readyz = %d %s; want 200 ok, redis ok, provider ok", r.status, r.raw)
	}
	p.Blackhole()
	start := time.Now()
	r = anon.do("GET", "/readyz", "", "")
	took := time.Since(start)
	c, _ := r.body["components"].(map[string]any)
	if r.status != 503 || r.body["status"] != "unavailable" || c["database"] != "unreachable" {
		t.Errorf("readyz with the database black-holed = %d %s; want 503 unavailable, database unreachable", r.status, r.raw)
	}
	if c["redis"] != "ok" || c["provider"] != "ok" || c["locks"] != "redis" {
		t.Errorf("readyz with only the database black-holed: redis %v, provider %v, locks %v; want ok, ok, redis (%s)", c["redis"], c["provider"], c["locks"], r.raw)
	}
	t.Logf("readyz with the database black-holed took %v", took)
}
