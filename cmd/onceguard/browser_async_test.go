package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/onceguard/onceguard/webhook"
)

// callbackGate stands between the provider and the service's callback
// endpoint: while closed it holds each callback (the provider's own
// timeout may give up on it, and it redelivers); open, it delivers each
// twice, one after the other, a duplicate the service must absorb, and
// answers the provider with the first answer.
type callbackGate struct {
	target string

	mu       sync.Mutex
	open     chan struct{} // closed when the gate opens; replaced when it closes again
	statuses []int         // the service's answers to every copy delivered
}

func newCallbackGate() *callbackGate { return &callbackGate{open: make(chan struct{})} }

func (g *callbackGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *callbackGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

func (g *callbackGate) answers() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.statuses...)
}

func (g *callbackGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	g.mu.Lock()
	open, target := g.open, g.target
	g.mu.Unlock()
	select {
	case <-open:
	case <-r.Context().Done():
		return // the provider gave up on this delivery; it redelivers
	}
	first := 0
	for range 2 {
		req, _ := http.NewRequestWithContext(context.WithoutCancel(r.Context()), http.MethodPost, target+"/api/v1/psp/notifications", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(webhook.OnceguardHeader, r.Header.Get(webhook.OnceguardHeader))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		g.mu.Lock()
		g.statuses = append(g.statuses, resp.StatusCode)
		g.mu.Unlock()
		if first == 0 {
			first = resp.StatusCode
		}
	}
	w.WriteHeader(first)
}

// With an async provider, the page shows a deposit as pending, then, once
// the provider's callback has settled it, as succeeded, in its list and
// under its form, with the new balance, without a reload; a declined
// withdrawal goes from pending to failed, refunded once. Each callback
// arrives twice; the ledger holds each movement once.
func TestBrowserAsyncSettles(t *testing.T) {
	path := needBrowser(t)
	gate := newCallbackGate()
	t.Cleanup(gate.release) // before the provider stops: it waits for its deliveries
	gateURL := serveLoopback(t, &http.Server{Handler: gate})
	pspURL := startPSP(t, "--notify", gateURL, "--async", "--settle-after", "50ms")
	// The reconciler waits an hour: only the callbacks settle here.
	base := startServe(t, "--psp", pspURL, "--psp-notify-secret", callbackSecret, "--reconcile-interval", "1h")
	gate.mu.Lock()
	gate.target = base
	gate.mu.Unlock()

	b := newBrowser(t, path, base)
	b.signUp("async")
	// A mark in the page's memory: a reload would lose it.
	b.waitFor(`(window.onceguardTestMark = 'no reload') === 'no reload'`, `'could not set the mark'`)

	b.submitOK("deposit-form", "25", "Done. Deposit of 25.00 CNY: the payment provider has not confirmed it yet")
	b.waitText("#deposits tbody", "pending")
	if got := eval[string](b, q("#balance")+".textContent"); !strings.HasPrefix(got, "0.00") {
		t.Errorf("balance while the deposit is pending = %q; want 0.00", got)
	}
	gate.release()
	b.waitText("#deposits tbody", "succeeded")
	b.waitText("#deposit-form .msg", "Settled. Deposit of 25.00 CNY: it went through.")
	b.waitText("#balance", "25.00")
	if got := eval[string](b, `window.onceguardTestMark || ''`); got != "no reload" {
		t.Fatalf("the page was reloaded (its mark is %q); want the change shown in place", got)
	}
	if n := b.getCount("/"); n != 1 {
		t.Errorf("the page itself was loaded %d times; want 1", n)
	}

	// A declined withdrawal: pending, then failed and refunded.
	gate.hold()
	pspFault(t, pspURL, "decline")
	b.submitOK("withdraw-form", "5", "Done. Withdrawal of 5.00 CNY: the payment provider has not confirmed it yet")
	b.waitText("#withdrawals tbody", "pending")
	b.waitText("#balance", "20.00") // debited while pending
	gate.release()
	b.waitText("#withdrawals tbody", "failed")
	b.waitText("#withdraw-form .msg", "Settled. Withdrawal of 5.00 CNY: the payment provider refused it, and your balance was refunded.")
	b.waitText("#balance", "25.00")
	if got := eval[string](b, `window.onceguardTestMark || ''`); got != "no reload" {
		t.Fatalf("the page was reloaded (its mark is %q); want the change shown in place", got)
	}

	// On the server: each movement once, settled once, though each
	// callback came twice.
	api := apiSignIn(t, base, "async")
	deps, wds := api.items("/api/v1/deposits"), api.items("/api/v1/withdrawals")
	if len(deps) != 1 || deps[0]["status"] != "succeeded" || len(wds) != 1 || wds[0]["status"] != "failed" {
		t.Errorf("deposits %v, withdrawals %v; want one succeeded deposit, one failed withdrawal", deps, wds)
	}
	if got := api.balance(); got != "25.00" {
		t.Errorf("balance = %s; want 25.00 (credited once, debited and refunded once)", got)
	}
	kinds := map[string]int{}
	for _, e := range api.items("/api/v1/ledger") {
		k, _ := e["kind"].(string)
		kinds[k]++
	}
	if kinds["deposit"] != 1 || kinds["withdrawal"] != 1 || kinds["withdrawal_refund"] != 1 || len(kinds) != 3 {
		t.Errorf("ledger kinds %v; want one deposit, one withdrawal, one refund", kinds)
	}
	answers := gate.answers()
	if len(answers) < 4 {
		t.Errorf("the service got %d callback copies %v; want at least 4 (two callbacks, each twice)", len(answers), answers)
	}
	for _, s := range answers {
		if s != http.StatusNoContent {
			t.Errorf("callback answers %v; want every copy 204", answers)
			break
		}
	}
}
