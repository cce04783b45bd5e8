package main

import (
	"testing"
)

// A withdrawal's session is checked in the transaction that debits, not
// from the instance's memory of it: signed out on one instance, the same
// session is refused 401 at once on another that served it a moment ago,
// for a new key and for the key it used (not its replay), and nothing
// moves. On SQLite the two are one instance. Two instances share the
// database, so one's submit token is good on the other.
func TestSignOutSeenAtOnce(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := twoInstances(t, name, append(db(t), "--require-submit-token", "none"))
			alice := signUp(t, a, "alice")
			onB := &client{t: t, base: b, token: alice.token}
			alice.expect(alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"50.00"}`), 201, "")
			onB.expect(onB.do("POST", "/api/v1/withdrawals", "wd-1", `{"amount":"1.00"}`), 201, "")
			tok := alice.submitToken("withdrawal") // minted on a, used on b
			onB.expect(onB.do("POST", "/api/v1/withdrawals", tok, `{"amount":"2.00"}`), 201, "")

			alice.expect(alice.do("DELETE", "/api/v1/sessions/current", "", ""), 204, "")
			onB.expect(onB.do("POST", "/api/v1/withdrawals", "wd-2", `{"amount":"3.00"}`), 401, "unauthenticated")
			onB.expect(onB.do("POST", "/api/v1/withdrawals", "wd-1", `{"amount":"1.00"}`), 401, "unauthenticated")
			onB.expect(onB.do("POST", "/api/v1/withdrawals", tok, `{"amount":"2.00"}`), 401, "unauthenticated")

			again := &client{t: t, base: a}
			s := again.do("POST", "/api/v1/sessions", "", `{"username":"alice","password":"correct horse"}`)
			again.expect(s, 201, "")
			again.token, _ = s.body["token"].(string)
			acct := again.do("GET", "/api/v1/account", "", "")
			if acct.status != 200 || acct.body["balance"] != "47.00" {
				t.Fatalf("account after = %d %v; want 47.00 (50 - 1 - 2: nothing moved after the sign-out)", acct.status, acct.body)
			}
		})
	}
}

// twoInstances starts the service twice on the database of args and returns both addresses;
// on the embedded default (named "sqlite"), whose file one process owns, once, both the same.
func twoInstances(t *testing.T, name string, args []string) (a, b string) {
	t.Helper()
	a = startServe(t, args...)
	if name == "sqlite" {
		return a, a
	}
	return a, startServe(t, args...)
}
