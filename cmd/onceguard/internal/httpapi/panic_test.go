package httpapi_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// panicky is a provider with a bug: while on, it panics.
type panicky struct {
	psp.Provider
	on atomic.Bool
}

func (p *panicky) Do(ctx context.Context, kind psp.Kind, key string, amount money.Amount) (psp.Operation, error) {
	if p.on.Load() {
		panic("provider bug")
	}
	return p.Provider.Do(ctx, kind, key, amount)
}

// A handler that panics (a bug) answers the contract's 500 internal as
// problem+json, logged with its stack and counted, instead of dropping the
// connection; its Idempotency-Key is freed, so the retry runs again and
// the money moves once.
func TestPanicAnswers500(t *testing.T) {
	p := &panicky{}
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) { p.Provider = c.Provider; c.Provider = p })
	p.on.Store(true)
	w := serveJSON(o.h, o.token, "POST", "/api/v1/deposits", "dep-1", `{"amount":"7.00"}`)
	if w.Code != 500 || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(w.Body.String(), `"code":"internal"`) {
		t.Fatalf("a deposit whose handler panicked = %d %q %s; want 500 problem+json, code internal", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	if logs := o.logs.String(); !strings.Contains(logs, `"msg":"handler panicked"`) || !strings.Contains(logs, "provider bug") {
		t.Errorf("no 'handler panicked' line with the panic's value in the logs:\n%s", logs)
	}
	if n := o.value(t, "onceguard_http_requests_total", "route", "/api/v1/deposits", "method", "POST", "code", "500"); n != 1 {
		t.Errorf("http_requests_total{code=500} = %v; want 1", n)
	}
	p.on.Store(false)
	if w := serveJSON(o.h, o.token, "POST", "/api/v1/deposits", "dep-1", `{"amount":"7.00"}`); w.Code != 201 || !strings.Contains(w.Body.String(), `"status":"succeeded"`) {
		t.Fatalf("the retry = %d %s; want 201 succeeded", w.Code, w.Body)
	}
	if code, out, _ := o.call("GET", "/api/v1/account", "", ""); code != 200 || out["balance"] != "7.00" {
		t.Errorf("account after the panic and the retry = %d %v; want balance 7.00", code, out)
	}
}
