package main

import (
	"testing"
	"time"
)

// The repeat-submit window survives Redis losing its data: a withdrawal's
// entry stays in the database, so the same body under a fresh key inside
// the window is 429 after Redis restarts empty, and after Redis was
// black-holed while the instance claimed (and then returned).
func TestWindowSurvivesRedisLoss(t *testing.T) {
	e := startChaos(t, chaosConfig{name: "window-redis", flags: []string{"--repeat-window", "60s"}})
	u := e.users[0]
	twice := func(what, body string, fault func()) {
		t.Helper()
		if a := e.send(u, "POST", "/api/v1/withdrawals", what+"-1", body); a.status != 201 {
			t.Fatalf("%s: first withdrawal = %d %s; want 201", what, a.status, a.raw)
		}
		fault()
		e.waitReady(10 * time.Second)
		if a := e.send(u, "POST", "/api/v1/withdrawals", what+"-2", body); a.status != 429 || a.code != "duplicate_submission" {
			t.Errorf("%s: the same body under a fresh key = %d %s; want 429 duplicate_submission (a second withdrawal)", what, a.status, a.raw)
		}
	}
	twice("restart", `{"amount":"1.00"}`, func() { e.redis.Restart(t) })
	e.redisP.Blackhole()
	twice("blackhole", `{"amount":"1.01"}`, func() { e.heal(e.redisP) })
}
