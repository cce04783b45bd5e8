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

	created, took := windowStorm(t, bases, c.token, "wd", `{"amount":"1.00"}`)
	if created != 1 {
		t.Errorf("%d of the storm's withdrawals of the same body created; want exactly 1", created)
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

// windowStorm sends body as 20 withdrawals at once under fresh keys
// (prefix-0, ...), alternating between bases, checks each is a 201 or a
// 429 with Retry-After 1..10, and returns the 201s and the times taken.
func windowStorm(t *testing.T, bases []string, token, prefix, body string) (created int, took []time.Duration) {
	t.Helper()
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
			req, _ := http.NewRequest("POST", bases[i%len(bases)]+"/api/v1/withdrawals", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Idempotency-Key", fmt.Sprint(prefix, "-", i))
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
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("%s %d: %v", prefix, i, r.err)
		case r.status == 201:
			created++
		case r.status == 429:
			if s, err := strconv.Atoi(r.retryAfter); err != nil || s < 1 || s > 10 {
				t.Errorf("%s %d: 429 with Retry-After %q; want 1..10", prefix, i, r.retryAfter)
			}
		default:
			t.Errorf("%s %d: %d; want 201 or 429", prefix, i, r.status)
		}
		took = append(took, r.took)
	}
	return created, took
}

// Across two instances on one Redis: a storm of one body under fresh keys
// creates one withdrawal; after Redis restarts empty, or after it was
// black-holed while the instances claimed and then returned, the same
// storm inside the window creates none.
func TestWindowStormSurvivesRedisLoss(t *testing.T) {
	if os.Getenv("ONCEGUARD_TEST_POSTGRES") == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set")
	}
	redistest.RequireBinaries(t)
	dbURL := dbtest.FreshPostgres(t, "onceguard_e2e_window2")
	srv := redistest.StartServer(t)
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	bin := buildFaultService(t)
	bases := make([]string, 2)
	for i := range bases {
		bases[i] = startFaultProcess(t, bin, "--addr", "127.0.0.1:0", "--db", dbURL, "--redis", "redis://"+p.Addr()+"/0",
			"--require-submit-token", "none", "--repeat-window", "10s").base
	}
	c := signUp(t, bases[0], "window2")
	c.expect(c.do("POST", "/api/v1/deposits", "dep-1", `{"amount":"100.00"}`), 201, "")
	ready := func() {
		t.Helper()
		for _, base := range bases {
			for deadline := time.Now().Add(5 * time.Second); ; {
				resp, err := http.Get(base + "/readyz")
				if err == nil {
					raw, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode == 200 && strings.Contains(string(raw), `"status":"ok"`) {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s not ready (ok) within 5s", base)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	cases := []struct {
		name          string
		before, after func()
	}{
		{"restart", func() {}, func() { srv.Restart(t) }},
		// Reset before Heal: the proxy would deliver the held bytes (the
		// claims sent into the black hole) after Heal.
		{"blackhole", p.Blackhole, func() { p.Reset(); _ = p.Heal() }},
	}
	for i, tc := range cases {
		body := fmt.Sprintf(`{"amount":"1.0%d"}`, i)
		tc.before()
		if created, _ := windowStorm(t, bases, c.token, tc.name+"-a", body); created != 1 {
			t.Errorf("%s: first storm created %d; want 1", tc.name, created)
		}
		tc.after()
		ready()
		if created, _ := windowStorm(t, bases, c.token, tc.name+"-b", body); created != 0 {
			t.Errorf("%s: the same storm again inside the window created %d; want 0 (a second withdrawal)", tc.name, created)
		}
	}
}
