package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/redistest"
)

// Redis killed in the middle of a storm: requests keep succeeding on the
// database's locks (in process on SQLite), /readyz says degraded, every
// key moves money once, and after Redis restarts the service uses it
// again.
func TestServeRedisOutage(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			base := startServe(t, append(db(t), "--redis", srv.URL(), "--require-submit-token", "", "--repeat-window", "0")...)
			testRedisOutage(t, base, srv)
		})
	}
}

func testRedisOutage(t *testing.T, base string, srv *redistest.Server) {
	anon := &client{t: t, base: base}
	ready := func() answer { return anon.do("GET", "/readyz", "", "") }
	if r := ready(); r.status != 200 || r.body["status"] != "ok" {
		t.Fatalf("readyz before = %d %s; want 200 ok", r.status, r.raw)
	}
	alice := signUp(t, base, "alice")
	alice.expect(alice.do("POST", "/api/v1/deposits", "d", `{"amount":"10000"}`), 201, "")

	// 6 workers withdraw 1.00 under fresh keys until told to stop; every
	// answer is kept by key.
	var (
		mu      sync.Mutex
		byKey   = map[string][]answer{}
		sent    atomic.Int64
		stop    = make(chan struct{})
		workers sync.WaitGroup
	)
	for w := range 6 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				a := alice.do("POST", "/api/v1/withdrawals", key, `{"amount":"1.00"}`)
				mu.Lock()
				byKey[key] = append(byKey[key], a)
				mu.Unlock()
				sent.Add(1)
			}
		}()
	}
	waitSent := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for sent.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d requests answered; want %d", sent.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	waitSent(30)
	if n, err := srv.Do("DBSIZE"); err != nil || n.(int64) == 0 {
		t.Errorf("DBSIZE on the service's Redis = %v, %v; want its lock keys there", n, err)
	}
	srv.Kill(t)
	killedAt := sent.Load()
	waitSent(killedAt + 60)
	if r := ready(); r.status != 200 || r.body["status"] != "degraded" {
		t.Errorf("readyz with Redis down = %d %s; want 200 degraded", r.status, r.raw)
	} else if c, _ := r.body["components"].(map[string]any); c["redis"] != "unreachable" || c["locks"] == "ok" {
		t.Errorf("readyz components = %v; want redis unreachable, locks on the fallback", c)
	}
	srv.Restart(t)
	// The breaker probes Redis after its cooldown (2 s); then the service
	// is ready again and takes its locks there.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := ready()
		if r.body["status"] == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz after Redis restarted = %s; want ok within 20 s", r.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, err := srv.Do("DBSIZE"); err != nil || n.(int64) == 0 {
		t.Errorf("DBSIZE on the restarted Redis = %v, %v; want the service's lock keys back", n, err)
	}
	waitSent(sent.Load() + 30)
	close(stop)
	workers.Wait()

	// Every request succeeded: no fault of Redis reached a client.
	ids := map[string]string{}
	for key, answers := range byKey {
		for _, a := range answers {
			if a.status != 201 {
				t.Errorf("key %s: %d %s; want 201 (Redis is not the client's problem)", key, a.status, a.raw)
				continue
			}
			ids[key] = fmt.Sprint(a.body["id"])
		}
	}
	// Each key moved money once, and only the keys' money moved.
	wds := alice.do("GET", "/api/v1/withdrawals", "", "")
	items, _ := wds.body["items"].([]any)
	seen := map[string]bool{}
	for _, it := range items {
		id := fmt.Sprint(it.(map[string]any)["id"])
		if seen[id] {
			t.Errorf("withdrawal %s listed twice", id)
		}
		seen[id] = true
	}
	if len(items) != len(ids) {
		t.Errorf("%d withdrawals for %d keys; want one each", len(items), len(ids))
	}
	t.Logf("%d withdrawals, %d while Redis was down or coming back", len(ids), int64(len(ids))-killedAt)
	stormBalance(t, alice, (10000_00 - money.Amount(len(ids))*1_00).String())
}

// --redis with several URLs: locks on a quorum of independent nodes. One
// node down leaves a quorum: the locks stay on Redis (readyz degraded for
// the lost node), and money still moves once per key.
func TestServeRedisQuorum(t *testing.T) {
	nodes := []*redistest.Server{redistest.StartServer(t), redistest.StartServer(t), redistest.StartServer(t)}
	urls := nodes[0].URL() + "," + nodes[1].URL() + "," + nodes[2].URL()
	base := startServe(t, "--redis", urls, "--require-submit-token", "")
	alice := signUp(t, base, "alice")
	alice.expect(alice.do("POST", "/api/v1/deposits", "d", `{"amount":"100"}`), 201, "")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "w1", `{"amount":"1.00"}`), 201, "")
	for i, n := range nodes {
		if keys, err := n.Do("DBSIZE"); err != nil || keys.(int64) == 0 {
			t.Errorf("node %d: DBSIZE = %v, %v; want the lock's keys on every node", i, keys, err)
		}
	}
	nodes[2].Kill(t)
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "w2", `{"amount":"2.00"}`), 201, "")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "w3", `{"amount":"3.00"}`), 201, "")
	r := alice.do("GET", "/readyz", "", "")
	c, _ := r.body["components"].(map[string]any)
	if r.status != 200 || r.body["status"] != "degraded" || c["redis"] != "unreachable" || c["locks"] != "ok" {
		t.Errorf("readyz with one node of three down = %d %s; want 200 degraded, redis unreachable, locks ok (a quorum is left)", r.status, r.raw)
	}
	stormBalance(t, alice, "94.00")
}
