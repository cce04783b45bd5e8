package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/redistest"
)

// The storms of the service issue, each request sent to one of bases in
// turn (one instance, or several sharing a database and Redis):
//
//   - 200 concurrent withdrawals with one submit token: one debit;
//   - 50 with different tokens and the same body: one accepted, the rest
//     429 duplicate_submission;
//   - 30 different withdrawals racing for a balance that covers only some:
//     the balance never goes below zero and the ledger sums to it;
//   - 50 concurrent payments of one order with different keys: paid once.
func stormSuite(t *testing.T, bases []string) {
	users := make([]*client, len(bases))
	users[0] = signUp(t, bases[0], "storm")
	for i := 1; i < len(bases); i++ { // the same user, signed in on each instance
		users[i] = &client{t: t, base: bases[i], token: users[0].token}
	}
	via := func(i int) *client { return users[i%len(users)] }
	alice := users[0]
	alice.expect(alice.do("POST", "/api/v1/deposits", "storm-dep", `{"amount":"1000.00"}`), 201, "")

	// 200 with one token.
	tok := alice.submitToken("withdrawal")
	answers := stormFire(200, func(i int) answer { return via(i).do("POST", "/api/v1/withdrawals", tok, `{"amount":"100.00"}`) })
	ids := map[string]bool{}
	for _, a := range answers {
		if a.status == 201 {
			ids[fmt.Sprint(a.body["id"])] = true
		}
	}
	if c := stormCodes(answers); c["201"] < 1 || c["201"]+c["409request_in_progress"] != 200 || len(ids) != 1 {
		t.Errorf("200 withdrawals with one token: %v, %d withdrawal ids; want 201s (one fresh, the rest replays) and 409 request_in_progress, one id", c, len(ids))
	}
	stormBalance(t, alice, "900.00")

	// 50 tokens, one body.
	toks := make([]string, 50)
	for i := range toks {
		toks[i] = alice.submitToken("withdrawal")
	}
	answers = stormFire(50, func(i int) answer { return via(i).do("POST", "/api/v1/withdrawals", toks[i], `{"amount":"7.00"}`) })
	if c := stormCodes(answers); c["201"] != 1 || c["429duplicate_submission"] != 49 {
		t.Errorf("50 tokens, same body: %v; want one 201 and 49 429 duplicate_submission", c)
	}
	for _, a := range answers {
		if a.status == 429 && a.header.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After: %s", a.raw)
			break
		}
	}
	stormBalance(t, alice, "893.00")

	// 30 different withdrawals (distinct amounts: no repeat window) for a
	// balance of 893.00 that covers about 25 of them.
	for i := range toks[:30] {
		toks[i] = alice.submitToken("withdrawal")
	}
	answers = stormFire(30, func(i int) answer {
		return via(i).do("POST", "/api/v1/withdrawals", toks[i], fmt.Sprintf(`{"amount":"%d.%02d"}`, 30+i/10, i+1))
	})
	var taken money.Amount
	for i, a := range answers {
		if a.status == 201 {
			amt, _ := money.Parse(fmt.Sprintf("%d.%02d", 30+i/10, i+1))
			taken += amt
		}
	}
	if c := stormCodes(answers); c["201"] == 0 || c["422insufficient_funds"] == 0 || c["201"]+c["422insufficient_funds"] != 30 {
		t.Errorf("30 withdrawals for part of the balance: %v; want some 201, the rest 422 insufficient_funds", c)
	}
	stormBalance(t, alice, (893_00 - taken).String())

	// 50 payments of one order, 50 keys.
	ord := alice.do("POST", "/api/v1/orders", alice.submitToken("order"), `{"amount":"1.00","description":"storm"}`)
	alice.expect(ord, 201, "")
	path := fmt.Sprintf("/api/v1/orders/%v/payment", ord.body["id"])
	answers = stormFire(50, func(i int) answer { return via(i).do("POST", path, fmt.Sprintf("pay-%d", i), `{"method":"wallet"}`) })
	if c := stormCodes(answers); c["201"] != 1 || c["409order_already_paid"]+c["409payment_in_progress"] != 49 {
		t.Errorf("50 payments of one order: %v; want one 201 and 49 409", c)
	}
	stormBalance(t, alice, (893_00 - taken - 1_00).String())
	for _, c := range users {
		c.expect(c.do("GET", "/api/v1/orders/"+fmt.Sprint(ord.body["id"]), "", ""), 200, "")
	}
}

// stormFire sends n requests at once and returns their answers by index.
func stormFire(n int, send func(i int) answer) []answer {
	out := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = send(i)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// stormCodes counts answers by status and problem code ("201",
// "429duplicate_submission").
func stormCodes(answers []answer) map[string]int {
	c := map[string]int{}
	for _, a := range answers {
		code, _ := a.body["code"].(string)
		c[fmt.Sprint(a.status, code)]++
	}
	return c
}

// stormBalance checks the balance and that the ledger sums to it.
func stormBalance(t *testing.T, c *client, want string) {
	t.Helper()
	acct := c.do("GET", "/api/v1/account", "", "")
	if acct.body["balance"] != want {
		t.Errorf("balance = %v; want %s", acct.body["balance"], want)
	}
	led := c.do("GET", "/api/v1/ledger", "", "")
	items, _ := led.body["items"].([]any)
	var sum money.Amount
	for _, it := range items {
		s, _ := it.(map[string]any)["amount"].(string)
		a, err := money.Parse(strings.TrimPrefix(s, "-"))
		if err != nil {
			t.Fatalf("ledger amount %q: %v", s, err)
		}
		if strings.HasPrefix(s, "-") {
			a = -a
		}
		sum += a
	}
	if sum.String() != acct.body["balance"] {
		t.Errorf("ledger sums to %s; balance %v", sum, acct.body["balance"])
	}
}

func TestServeStorms(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) { stormSuite(t, []string{startServe(t, db(t)...)}) })
	}
}

// stormRedis starts a Redis server of the test's own (the service tests
// may kill it) and returns its URL.
func stormRedis(t *testing.T) string {
	t.Helper()
	return redistest.StartServer(t).URL()
}
