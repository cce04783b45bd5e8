package main

import "testing"

// Signed out on one instance, a session is refused 401 on another that
// served it a moment ago also when its withdrawal would be refused before
// the debit's transaction (a plain key, a bad token, a bad body): no 400,
// and no fresh submit token (Next-Submit-Token) for the signed-out
// session. On SQLite the two are one instance.
func TestSignOutSeenBeforeTheDebit(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := twoInstances(t, name, db(t))
			alice := signUp(t, a, "alice")
			onB := &client{t: t, base: b, token: alice.token}
			alice.expect(alice.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"50.00"}`), 201, "")
			tok := alice.submitToken("withdrawal")
			onB.expect(onB.do("POST", "/api/v1/withdrawals", tok, `{"amount":"1.00"}`), 201, "")

			alice.expect(alice.do("DELETE", "/api/v1/sessions/current", "", ""), 204, "")
			for _, c := range []struct{ key, body string }{
				{"plain-key", `{"amount":"1.00"}`},
				{"st_bogus", `{"amount":"1.00"}`},
				{tok, `{"amount":"nope"}`},
			} {
				ans := onB.do("POST", "/api/v1/withdrawals", c.key, c.body)
				onB.expect(ans, 401, "unauthenticated")
				if next := ans.header.Get("Next-Submit-Token"); next != "" {
					t.Errorf("key %q after sign-out: Next-Submit-Token %q; want none", c.key, next)
				}
			}
		})
	}
}
