package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/redistest"
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

// With three Redis nodes and the first black-holed, a storm of the same
// withdrawal under fresh keys across two instances accepts exactly one,
// turns the rest away with Retry-After within the window, and no
// withdrawal waits out the silent node's timeout (the window does not
// touch Redis).
func TestWindowFirstOfThreeRedisNodesLost(t *testing.T) {
	if os.Getenv("ONCEGUARD_TEST_POSTGRES") == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set")
	}
	redistest.RequireBinaries(t)
	dbURL := dbtest.FreshPostgres(t, "onceguard_e2e_window3")
	first, err := faultproxy.Start(redistest.StartServer(t).Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	urls := "redis://" + first.Addr() + "/0,redis://" + redistest.StartServer(t).Addr() + "/0,redis://" + redistest.StartServer(t).Addr() + "/0"
	bin := buildFaultService(t)
	bases := make([]string, 2)
	for i := range bases {
		bases[i] = startFaultProcess(t, bin, "--addr", "127.0.0.1:0", "--db", dbURL, "--redis", urls,
			"--require-submit-token", "none", "--repeat-window", "10s").base
	}
	c := signUp(t, bases[0], "window3")
	c.expect(c.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100.00"}`), 201, "")
	first.Blackhole()

	const n = 20
	type result struct {
		status     int
		retryAfter string
		took       time.Duration
		err        error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", bases[i%2]+"/api/v1/withdrawals", strings.NewReader(`{"amount":"1.00"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+c.token)
			req.Header.Set("Idempotency-Key", fmt.Sprint("wd-", i))
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results[i].err = err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			results[i] = result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), took: time.Since(start)}
		}()
	}
	wg.Wait()
	created := 0
	var took []time.Duration
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("request %d: %v", i, r.err)
		case r.status == 201:
			created++
		case r.status == 429:
			if s, err := strconv.Atoi(r.retryAfter); err != nil || s < 1 || s > 10 {
				t.Errorf("request %d: 429 with Retry-After %q; want 1..10", i, r.retryAfter)
			}
		default:
			t.Errorf("request %d: %d; want 201 or 429", i, r.status)
		}
		took = append(took, r.took)
	}
	if created != 1 {
		t.Errorf("%d of %d withdrawals of the same body created; want exactly 1", created, n)
	}
	// Sequential ones, after the storm: each alone, none waits for a node.
	for i := range 6 {
		start := time.Now()
		a := c.do("POST", "/api/v1/withdrawals", fmt.Sprint("seq-", i), fmt.Sprintf(`{"amount":"2.0%d"}`, i))
		took = append(took, time.Since(start))
		c.expect(a, 201, "")
	}
	slices.Sort(took)
	if med := took[len(took)/2]; med >= 400*time.Millisecond {
		t.Errorf("median withdrawal with the first Redis node black-holed took %v; want well under its 500 ms timeout", med)
	}
	t.Logf("median %v, max %v", took[len(took)/2], took[len(took)-1])
}
