package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// stuckPayouts is a provider whose payouts wait for their caller's
// context. Then, stuck, they end with an unknown outcome (nothing moved);
// late, they are made and answered just after it ended (the answer was on
// its way).
type stuckPayouts struct {
	psp.Sim
	late    bool
	payouts atomic.Int32
}

func (p *stuckPayouts) Do(ctx context.Context, kind psp.Kind, key string, amount money.Amount) (psp.Operation, error) {
	if kind != psp.Payout {
		return p.Sim.Do(ctx, kind, key, amount)
	}
	p.payouts.Add(1)
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		return psp.Operation{}, psp.ErrUnknownOutcome
	}
	if p.late {
		time.Sleep(10 * time.Millisecond)
		return p.Sim.Do(context.WithoutCancel(ctx), kind, key, amount)
	}
	return psp.Operation{}, fmt.Errorf("%w: %w", psp.ErrUnknownOutcome, ctx.Err())
}

// PITFALLS 17: an in-progress lease shorter than the work lets a slow
// request run twice. A keyed request has a deadline inside its key's
// lease: a withdrawal whose payout does not answer ends at the deadline
// with its answer (pending, for the reconciler) stored, so a retry after
// the lease gets that answer and does not run it again. Without the
// deadline the first request would still be waiting for the provider
// when the lease ran out, and the retry would take the key over and run.
// A RequestTimeout that would outlast the lease is cut to 3/5 of it.
func TestRequestEndsInsideKeyLease(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
	}{
		{"300ms", 300 * time.Millisecond},
		{"an hour, cut to 600ms", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) { requestEndsInsideKeyLease(t, tc.timeout) })
	}
}

func requestEndsInsideKeyLease(t *testing.T, timeout time.Duration) {
	prov := &stuckPayouts{}
	const lease = time.Second
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) {
		c.App.KeyLease, c.App.RequestTimeout = lease, timeout
		c.Provider = obs.Provider{Provider: prov, Metrics: c.Metrics}
	})
	tok := o.fundedToken(t)

	start := time.Now()
	w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	took := time.Since(start)
	var first map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &first)
	if w.Code != 201 || first["status"] != "pending" {
		t.Fatalf("withdrawal with the payout stuck = %d %v; want 201 pending", w.Code, first)
	}
	if took >= 20*time.Second {
		t.Fatalf("the withdrawal took %v: its deadline did not end it", took)
	}

	time.Sleep(lease + 200*time.Millisecond) // the key's lease has run out
	w = serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	var again map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &again)
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || again["id"] != first["id"] || again["status"] != "pending" {
		t.Errorf("the retry after the lease = %d %v (replayed %q); want the stored 201 pending of %v, replayed", w.Code, again, w.Header().Get("Idempotent-Replayed"), first["id"])
	}
	if n := prov.payouts.Load(); n != 1 {
		t.Errorf("payouts sent = %d; want 1 (the retry must not run the withdrawal again)", n)
	}
	_, acct, _ := o.call("GET", "/api/v1/account", "", "")
	if acct["balance"] != "90.00" {
		t.Errorf("balance = %v; want 90.00 (debited once)", acct["balance"])
	}
}

// The provider's answer arrives after the request's deadline: the
// settlement and the stored answer still commit (on a context of their
// own, bounded by a quarter of the deadline more), so the client gets the
// outcome, 201 succeeded, not a 503 or a pending movement the provider has
// in fact paid. The retry replays it; one payout, one debit.
func TestSettledAfterDeadline(t *testing.T) {
	prov := &stuckPayouts{late: true}
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) {
		c.App.KeyLease, c.App.RequestTimeout = 2*time.Second, 300*time.Millisecond
		c.Provider = obs.Provider{Provider: prov, Metrics: c.Metrics}
	})
	tok := o.fundedToken(t)
	w := serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	var first map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &first)
	if w.Code != 201 || first["status"] != "succeeded" {
		t.Fatalf("withdrawal answered after the deadline = %d %v; want 201 succeeded", w.Code, first)
	}
	w = serveJSON(o.h, o.token, "POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	var again map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &again)
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || again["id"] != first["id"] || again["status"] != "succeeded" {
		t.Errorf("retry = %d %v (replayed %q); want the stored 201 succeeded", w.Code, again, w.Header().Get("Idempotent-Replayed"))
	}
	_, acct, _ := o.call("GET", "/api/v1/account", "", "")
	if n := prov.payouts.Load(); n != 1 || acct["balance"] != "90.00" {
		t.Errorf("payouts %d, balance %v; want 1, 90.00", n, acct["balance"])
	}
}
