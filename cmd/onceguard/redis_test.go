package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
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
			dbArgs := db(t)
			secondary := "memory" // SQLite: one process, locks in process
			if len(dbArgs) > 0 {
				secondary = "database"
			}
			logs := &syncBuffer{}
			base, stop := startServeLogs(t, logs, append(dbArgs, "--redis", srv.URL(), "--require-submit-token", "", "--repeat-window", "0", "--log-format", "json")...)
			t.Cleanup(func() {
				if err := stop(); err != nil {
					t.Errorf("serve after cancel = %v; want nil", err)
				}
			})
			testRedisOutage(t, base, srv, secondary)
			// Lines about a request's lock (a failed acquire, a lost lease,
			// a refused stale write) are the request's: they carry its id.
			sc := bufio.NewScanner(strings.NewReader(logs.String()))
			for sc.Scan() {
				var line map[string]any
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					t.Fatalf("log line is not JSON: %q", sc.Text())
				}
				if msg, _ := line["msg"].(string); (strings.HasPrefix(msg, "lock ") || strings.HasPrefix(msg, "stale fence")) && line["request_id"] == nil {
					t.Errorf("lock log line without a request id: %s", sc.Text())
				}
			}
		})
	}
}

func testRedisOutage(t *testing.T, base string, srv *redistest.Server, secondary string) {
	anon := &client{t: t, base: base}
	ready := func() answer { return anon.do("GET", "/readyz", "", "") }
	if r := ready(); r.status != 200 || r.body["status"] != "ok" {
		t.Fatalf("readyz before = %d %s; want 200 ok", r.status, r.raw)
	} else if c, _ := r.body["components"].(map[string]any); c["redis"] != "ok" || c["locks"] != "redis" {
		t.Errorf("readyz components before = %v; want redis ok, locks redis", c)
	}
	metric := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, _ := metricValue(scrape(t, base), name, labels)
		return v
	}
	if d, sw := metric("onceguard_lock_fallback_degraded", nil), metric("onceguard_lock_fallback_switches_total", map[string]string{"to": "database"}); d != 0 || sw != 0 {
		t.Errorf("before the outage: lock_fallback_degraded %v, switches to the database %v; want 0, 0", d, sw)
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
	} else if c, _ := r.body["components"].(map[string]any); c["redis"] != "unreachable" || !strings.HasPrefix(fmt.Sprint(c["locks"]), secondary+" (fallback") {
		t.Errorf("readyz components = %v; want redis unreachable, locks %s (fallback...)", c, secondary)
	}
	// The breaker stays open while Redis is dead (it probes it only after
	// its cooldown, and the probe fails): degraded, one switch so far.
	if d, sw := metric("onceguard_lock_fallback_degraded", nil), metric("onceguard_lock_fallback_switches_total", map[string]string{"to": "database"}); d != 1 || sw < 1 {
		t.Errorf("Redis down: lock_fallback_degraded %v, switches to the database %v; want 1, at least 1", d, sw)
	}
	if n := metric("onceguard_lock_acquires_total", map[string]string{"backend": secondary, "result": "acquired"}); n < 1 {
		t.Errorf("lock_acquires_total{backend=%s,acquired} = %v; want the fallback's leases counted", secondary, n)
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
	// Back on Redis: not degraded, and every switch away was matched by
	// one back.
	// (Polled: a slow Redis reply under load may flip the breaker again
	// for a moment.)
	for deadline := time.Now().Add(20 * time.Second); ; {
		toDB, toRedis := metric("onceguard_lock_fallback_switches_total", map[string]string{"to": "database"}), metric("onceguard_lock_fallback_switches_total", map[string]string{"to": "redis"})
		d := metric("onceguard_lock_fallback_degraded", nil)
		if d == 0 && toDB >= 1 && toRedis == toDB {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("Redis back: lock_fallback_degraded %v, switches to the database %v and back to Redis %v; want 0, at least 1, as many back", d, toDB, toRedis)
			break
		}
		time.Sleep(50 * time.Millisecond)
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
	// The list is the newest 1000 (docs/api.md); a fast machine sends more.
	// The balance below counts them all.
	if want := min(len(ids), 1000); len(items) != want {
		t.Errorf("%d withdrawals listed for %d keys; want one each (the newest %d)", len(items), len(ids), want)
	}
	answered := map[string]bool{}
	for _, id := range ids {
		answered[id] = true
	}
	for id := range seen {
		if !answered[id] {
			t.Errorf("withdrawal %s listed, but no key's answer named it", id)
		}
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
	// A call returns once a majority answered; the last node's part of it
	// lands in the background, within the node timeout.
	for i, n := range nodes {
		var keys any
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if keys, err = n.Do("DBSIZE"); (err == nil && keys.(int64) > 0) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || keys.(int64) == 0 {
			t.Errorf("node %d: DBSIZE = %v, %v; want the lock's keys on every node", i, keys, err)
		}
	}
	nodes[2].Kill(t)
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "w2", `{"amount":"2.00"}`), 201, "")
	alice.expect(alice.do("POST", "/api/v1/withdrawals", "w3", `{"amount":"3.00"}`), 201, "")
	r := alice.do("GET", "/readyz", "", "")
	c, _ := r.body["components"].(map[string]any)
	if r.status != 200 || r.body["status"] != "degraded" || c["redis"] != "2 of 3 nodes answer (a quorum: locks stay on Redis)" || c["locks"] != "redis" {
		t.Errorf("readyz with one node of three down = %d %s; want 200 degraded, redis 2 of 3 nodes answer (a quorum), locks redis", r.status, r.raw)
	}
	stormBalance(t, alice, "94.00")
}
