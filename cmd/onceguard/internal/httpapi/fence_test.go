package httpapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/lock"
)

// PITFALLS 1, end to end: the withdrawal carries its lease's fence into
// the transaction. Here, right after the request's lease is granted,
// another holder (the request paused past its TTL, say) takes the lock
// with a newer fence and writes first. The request's write under the
// older fence is refused, and it runs again under a new lease: one
// withdrawal of its own, debited once, after the other holder's. A
// withdrawal that did not pass its fence (0: none, which the store does
// not check) would have written under the lease it had lost.
func TestWithdrawalCarriesItsFence(t *testing.T) {
	var store *sqlstore.Store
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) { store = c.Store })
	tok := o.fundedToken(t)
	_, acct, _ := o.call("GET", "/api/v1/account", "", "")
	user := acct["user_id"].(string)
	grants := 0
	o.locks.onGrant = func(r lock.Request, g lock.Grant) {
		if r.Key != "user:"+user {
			return
		}
		if grants++; grants > 1 {
			return
		}
		_, _, err := store.Withdraw(context.Background(), app.Movement{ID: "wd_other", UserID: user, Key: "other-holder", Amount: 100, CreatedAt: time.UnixMicro(1)}, g.Fence+1, nil)
		if err != nil {
			t.Errorf("the other holder's withdrawal: %v", err)
		}
	}
	code, out, _ := o.call("POST", "/api/v1/withdrawals", tok, `{"amount":"10"}`)
	if code != 201 || out["status"] != "succeeded" {
		t.Fatalf("withdrawal overtaken by a newer holder = %d %v; want 201 succeeded (after a retry under a new lease)", code, out)
	}
	if grants != 2 {
		t.Errorf("leases granted on the user = %d; want 2 (the write under the overtaken one refused, then a new one)", grants)
	}
	_, acct, _ = o.call("GET", "/api/v1/account", "", "")
	if acct["balance"] != "89.00" {
		t.Errorf("balance = %v; want 89.00 (100 - 1.00 by the other holder - 10 once)", acct["balance"])
	}
	_, list, _ := o.call("GET", "/api/v1/withdrawals", "", "")
	if items, _ := list["items"].([]any); len(items) != 2 {
		t.Errorf("withdrawals = %v; want 2 (the other holder's and this one)", list["items"])
	}
}
