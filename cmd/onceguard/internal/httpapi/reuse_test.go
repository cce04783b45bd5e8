package httpapi_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
)

// A key whose record is gone (past --key-ttl) reaches the handler again.
// The business table's UNIQUE (user_id, idempotency_key) refuses a second
// movement; with another body the answer is 422 idempotency_key_reused,
// not a 201 showing the first movement as if it were this request's. With
// the same body it is that movement again (a retry). Nothing moves twice.
func TestKeyReusedAfterItsRecord(t *testing.T) {
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) {
		c.KeyTTL = time.Millisecond
		c.RequireToken = nil
		c.Window = 0
	})
	balance := func() any {
		_, acct, _ := o.call("GET", "/api/v1/account", "", "")
		return acct["balance"]
	}
	for _, tc := range []struct {
		path, key, first, other string
	}{
		{"/api/v1/deposits", "dep-k", `{"amount":"100"}`, `{"amount":"200"}`},
		{"/api/v1/withdrawals", "wd-k", `{"amount":"10"}`, `{"amount":"20"}`},
		{"/api/v1/orders", "ord-k", `{"amount":"5","description":"first"}`, `{"amount":"5","description":"second"}`},
	} {
		code, first, _ := o.call("POST", tc.path, tc.key, tc.first)
		if code != 201 {
			t.Fatalf("%s first = %d %v", tc.path, code, first)
		}
		before := balance()
		time.Sleep(5 * time.Millisecond) // the key's record expires
		if code, out, _ := o.call("POST", tc.path, tc.key, tc.other); code != 422 || out["code"] != "idempotency_key_reused" {
			t.Errorf("%s, the key again with another body = %d %v; want 422 idempotency_key_reused", tc.path, code, out)
		}
		time.Sleep(5 * time.Millisecond)
		if code, again, _ := o.call("POST", tc.path, tc.key, tc.first); code != 201 || again["id"] != first["id"] {
			t.Errorf("%s, the key again with its body = %d %v; want 201 %v", tc.path, code, again, first["id"])
		}
		if got := balance(); got != before {
			t.Errorf("%s: balance %v after the reuses; want %v (nothing moved)", tc.path, got, before)
		}
	}

	// A payment's key is scoped to its order (UNIQUE (user_id, order_id,
	// idempotency_key), as api.md scopes keys by path): the same key on
	// another order is another request, and pays it.
	_, a, _ := o.call("POST", "/api/v1/orders", "ord-a", `{"amount":"1","description":"a"}`)
	_, b, _ := o.call("POST", "/api/v1/orders", "ord-b", `{"amount":"1","description":"b"}`)
	for _, ord := range []map[string]any{a, b} {
		if code, out, _ := o.call("POST", "/api/v1/orders/"+ord["id"].(string)+"/payment", "pay-k", `{"method":"wallet"}`); code != 201 || out["order_id"] != ord["id"] {
			t.Errorf("pay %v under pay-k = %d %v; want 201 for that order", ord["id"], code, out)
		}
	}
}

// A deposit that would take the balance past MaxBalance is refused before
// the provider is charged (422 balance_limit): its credit could not be
// settled after the charge. The balance is unchanged.
func TestDepositPastBalanceLimit(t *testing.T) {
	var store *sqlstore.Store
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) { store = c.Store })
	_, acct, _ := o.call("GET", "/api/v1/account", "", "")
	user := acct["user_id"].(string)
	ctx := context.Background()
	if _, _, err := store.CreateDeposit(ctx, app.Movement{ID: "dep_full", UserID: user, Key: "full", Amount: app.MaxBalance - 50, CreatedAt: time.UnixMicro(1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SettleDeposit(ctx, "dep_full", true, time.UnixMicro(1)); err != nil {
		t.Fatal(err)
	}
	_, before, _ := o.call("GET", "/api/v1/account", "", "")
	if code, out, _ := o.call("POST", "/api/v1/deposits", "over", `{"amount":"1.00"}`); code != 422 || out["code"] != "balance_limit" {
		t.Errorf("deposit past the limit = %d %v; want 422 balance_limit", code, out)
	}
	if code, _, _ := o.call("POST", "/api/v1/deposits", "under", `{"amount":"0.50"}`); code != 201 {
		t.Errorf("deposit up to the limit = %d; want 201", code)
	}
	_, after, _ := o.call("GET", "/api/v1/account", "", "")
	if before["balance"] == after["balance"] {
		t.Errorf("balance %v after the deposit up to the limit; want it credited", after["balance"])
	}
}

// The ledger is answered whole, so that its amounts sum to the balance
// (docs/api.md), however long it is; the other lists are the newest 1000.
func TestLedgerWhole(t *testing.T) {
	var store *sqlstore.Store
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) { store = c.Store })
	_, acct, _ := o.call("GET", "/api/v1/account", "", "")
	user := acct["user_id"].(string)
	ctx := context.Background()
	for i := range 1010 {
		id := "dep_" + strconv.Itoa(i)
		if _, _, err := store.CreateDeposit(ctx, app.Movement{ID: id, UserID: user, Key: id, Amount: 1, CreatedAt: time.UnixMicro(int64(i))}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.SettleDeposit(ctx, id, true, time.UnixMicro(int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	_, ledger, _ := o.call("GET", "/api/v1/ledger", "", "")
	items, _ := ledger["items"].([]any)
	if len(items) != 1010 {
		t.Errorf("ledger has %d entries; want all 1010", len(items))
	}
	_, deposits, _ := o.call("GET", "/api/v1/deposits", "", "")
	if items, _ := deposits["items"].([]any); len(items) != 1000 {
		t.Errorf("deposits list has %d; want the newest 1000", len(items))
	}
}
