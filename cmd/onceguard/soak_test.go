package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/sqldialect"
)

var soakFor = flag.Duration("soak", 8*time.Second, "how long TestSoak keeps its steady load (e.g. -soak 10m)")

// A steady mixed load for -soak: failed sign-ins under ever new
// usernames, deposits, withdrawals with submit tokens, orders and
// payments, reads, every request from a new client address (through
// --client-ip-header, as behind a proxy). Afterwards goroutines, open
// file descriptors (connections) and the heap return to their baseline
// (in a long -soak the addresses outnumber the limiters' cap, so the heap
// shows they stay bounded), nothing answered 5xx, no sign-in was refused 429 (each address and
// username is counted on its own) and every ledger sums to its balance.
// TestSoakStoresBounded counts the in-memory stores themselves.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: not in -short")
	}
	base, stop := startServeLogs(t, os.Stderr, "--log-level", "error", "--client-ip-header", "X-Real-IP")
	defer stop()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	const workers = 6
	users := make([]*client, workers)
	for i := range users {
		users[i] = signUp(t, base, fmt.Sprintf("soak%d", i))
		users[i].expect(users[i].do("POST", "/api/v1/deposits", "soak-seed", `{"amount":"100000"}`), 201, "")
	}

	// One warm-up round of everything, then the baseline.
	var (
		sent    atomic.Int64
		addrs   atomic.Uint64 // client addresses used
		signIns atomic.Int64  // failed sign-ins, each under a new username
		bad     sync.Map      // "status code" -> count
		stopped atomic.Bool
	)
	step := func(c *client, i int) {
		send := func(method, path, key, body string) answer {
			req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+c.token)
			req.Header.Set("X-Real-IP", soakAddr(addrs.Add(1)))
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			resp, err := hc.Do(req)
			sent.Add(1)
			if err != nil {
				bad.Store("transport: "+err.Error(), 1)
				return answer{}
			}
			defer resp.Body.Close()
			var a answer
			a.status = resp.StatusCode
			buf := make([]byte, 4096)
			n, _ := resp.Body.Read(buf)
			a.raw = string(buf[:n])
			if a.status >= 500 {
				bad.Store(fmt.Sprint(a.status, " ", a.raw), 1)
			}
			return a
		}
		tok := send("POST", "/api/v1/submit-tokens", "", `{"purpose":"withdrawal"}`)
		key := ""
		if j := strings.Index(tok.raw, `"token":"`); j >= 0 {
			key = strings.SplitN(tok.raw[j+9:], `"`, 2)[0]
		}
		send("POST", "/api/v1/withdrawals", key, fmt.Sprintf(`{"amount":"0.%02d"}`, 1+i%99))
		send("POST", "/api/v1/deposits", fmt.Sprintf("d-%d", i), fmt.Sprintf(`{"amount":"1.%02d"}`, i%100))
		ord := send("POST", "/api/v1/orders", fmt.Sprintf("o-%d", i), fmt.Sprintf(`{"amount":"0.50","description":"soak %d"}`, i))
		if j := strings.Index(ord.raw, `"id":"`); j >= 0 {
			id := strings.SplitN(ord.raw[j+6:], `"`, 2)[0]
			send("POST", "/api/v1/orders/"+id+"/payment", fmt.Sprintf("p-%d", i), `{"method":"wallet"}`)
		}
		if i%2 == 0 { // an argon2id hash each: every other step
			if a := send("POST", "/api/v1/sessions", "", fmt.Sprintf(`{"username":"ghost%d","password":"wrong password"}`, signIns.Add(1))); a.status != 401 && a.status != 0 {
				bad.Store(fmt.Sprint("failed sign-in: ", a.status, " ", a.raw), 1)
			}
		}
		send("GET", "/api/v1/account", "", "")
		send("GET", "/api/v1/ledger", "", "")
		send("GET", "/api/v1/withdrawals", "", "")
		send("GET", "/api/v1/nope", "", "")
	}
	load := func(d time.Duration) {
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for w, c := range users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w * 1_000_000; time.Now().Before(end) && !stopped.Load(); i++ {
					step(c, i)
				}
			}()
		}
		wg.Wait()
	}
	settle := func() (goroutines, fds int, heap uint64) {
		tr.CloseIdleConnections()
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		time.Sleep(200 * time.Millisecond)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), openFDs(), ms.HeapAlloc
	}
	load(time.Second)
	g0, f0, h0 := settle()

	load(*soakFor)
	// Goroutines and descriptors drain within a few seconds of the load
	// stopping (server connections close as the client closes them).
	var g1, f1 int
	var h1 uint64
	for deadline := time.Now().Add(10 * time.Second); ; {
		g1, f1, h1 = settle()
		if (g1 <= g0+3 && f1 <= f0+3) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("soak %v: %d requests from %d client addresses, %d failed sign-ins under as many usernames; goroutines %d -> %d, open fds %d -> %d, heap %d KiB -> %d KiB",
		*soakFor, sent.Load(), addrs.Load(), signIns.Load(), g0, g1, f0, f1, h0>>10, h1>>10)
	if g1 > g0+3 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines %d after the load, %d before: a leak\n%s", g1, g0, buf[:runtime.Stack(buf, true)])
	}
	if f0 >= 0 && f1 > f0+3 {
		t.Errorf("open file descriptors %d after the load, %d before: a leak", f1, f0)
	}
	if h1 > h0+32<<20 {
		t.Errorf("heap %d KiB after the load and a GC, %d KiB before: more than 32 MiB kept", h1>>10, h0>>10)
	}
	bad.Range(func(k, v any) bool {
		t.Errorf("answer: %v", k)
		return true
	})
	for _, c := range users {
		stormBalance(t, c, fmt.Sprint(c.do("GET", "/api/v1/account", "", "").body["balance"]))
	}
	if err := stop(); err != nil {
		t.Errorf("serve = %v", err)
	}
}

// openFDs counts this process's open file descriptors (Linux), or -1.
func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries)
}

// soakAddr is the n-th client address: IPv4 10.0.0.1 onwards, every
// fourth one IPv6, each in a /64 of its own (the limits count an IPv6
// client as its /64).
func soakAddr(n uint64) string {
	if n%4 == 0 {
		return fmt.Sprintf("fd00:%x:%x::1", n>>16&0xffff, n&0xffff)
	}
	return fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255)
}

// The service's in-memory stores stay bounded however many clients come:
// the per-address token buckets, the failed-sign-in counters (per
// username and address, per address, per username) and the in-process
// lock table (SQLite: locks in memory). The service is built as serve
// builds it (openDB, newCoordination, httpapi.New) and driven in process,
// so that the test can count them (httpapi.Sizes, memlock's Len): orders,
// payments and withdrawals taking a lock each, failed sign-ins under new
// usernames, every request from a new client address, then a flood of
// more new addresses than the limiters keep. The failure counters cannot
// be pushed past their cap here (each failure costs an argon2id hash);
// internal/httpapi TestLimitersBounded does that on the limiters alone.
func TestSoakStoresBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: not in -short")
	}
	ctx := context.Background()
	db, dialect, _, err := openDB(serveConfig{dataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlstore.Migrate(ctx, db, dialect); err != nil {
		t.Fatal(err)
	}
	keys, err := idemsql.New(db, sqldialect.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	coord, err := newCoordination(db, dialect, "", keys, nil, lock.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer coord.close()
	locks, ok := coord.locks.Backend().(*memlock.Backend)
	if !ok {
		t.Fatalf("locks on %T with SQLite; want the in-process *memlock.Backend", coord.locks.Backend())
	}
	store := sqlstore.Open(db, dialect)
	store.Records = keys
	svc := app.New(app.Config{Store: store, Provider: psp.Port(&psp.Sim{}), Currency: "CNY", MaxAmount: money.Amount(100_000_000),
		SessionTTL: time.Hour, Locks: coord.locks})
	h := httpapi.New(httpapi.Config{
		App: svc, Keys: keys, RequireToken: map[string]bool{"withdrawal": true}, Window: 10 * time.Second, KeyTTL: 24 * time.Hour, TokenTTL: 5 * time.Minute,
		Windows: coord.windows, RateLimit: 2000, RateBurst: 4000, LoginAttempts: 5, ClientIPHeader: "X-Real-IP",
	})

	var (
		addrs atomic.Uint64 // client addresses used, one per request
		mu    sync.Mutex
		bad   []string
	)
	do := func(method, path, bearer, key, body string) (int, map[string]any) {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Real-IP", soakAddr(addrs.Add(1)))
		if bearer != "" {
			r.Header.Set("Authorization", "Bearer "+bearer)
		}
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var b map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		if w.Code >= 500 || w.Code == http.StatusTooManyRequests {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%s %s: %d %s", method, path, w.Code, w.Body.String()))
			mu.Unlock()
		}
		return w.Code, b
	}
	str := func(b map[string]any, k string) string { v, _ := b[k].(string); return v }

	const workers, rounds = 4, 15
	began := time.Now()
	var failed atomic.Int64 // failed sign-ins, each under a new username
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("bounded%d", w)
			do("POST", "/api/v1/users", "", "", `{"username":"`+name+`","password":"correct horse"}`)
			_, sess := do("POST", "/api/v1/sessions", "", "", `{"username":"`+name+`","password":"correct horse"}`)
			tok := str(sess, "token")
			do("POST", "/api/v1/deposits", tok, "seed", `{"amount":"100000"}`)
			for i := range rounds {
				if _, o := do("POST", "/api/v1/orders", tok, fmt.Sprint("o-", i), fmt.Sprintf(`{"amount":"0.50","description":"bounded %d"}`, i)); str(o, "id") != "" {
					do("POST", "/api/v1/orders/"+str(o, "id")+"/payment", tok, fmt.Sprint("p-", i), `{"method":"wallet"}`)
				}
				_, st := do("POST", "/api/v1/submit-tokens", tok, "", `{"purpose":"withdrawal"}`)
				do("POST", "/api/v1/withdrawals", tok, str(st, "token"), fmt.Sprintf(`{"amount":"0.%02d"}`, 1+i))
				do("GET", "/api/v1/account", tok, "", "")
				if i%3 == 0 {
					if code, _ := do("POST", "/api/v1/sessions", "", "", fmt.Sprintf(`{"username":"nobody%d","password":"wrong password"}`, failed.Add(1))); code != 401 {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("failed sign-in: %d; want 401", code))
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, b := range bad {
		t.Error(b)
	}

	// Every address and every failure counted, nothing else: the hook
	// sees the live maps.
	z, ok := httpapi.Sizes(h)
	if !ok {
		t.Fatal("httpapi.Sizes: not a handler from httpapi.New")
	}
	if n := uint64(z.Rates); n != addrs.Load() {
		t.Errorf("token buckets: %d; want one per client address, %d", z.Rates, addrs.Load())
	}
	if f := int(failed.Load()); z.LoginPair != f || z.LoginAddr != f || z.LoginUser != f {
		t.Errorf("failed sign-in counters %+v; want %d each (every failure a new username and address, successes forgotten)", z, f)
	}
	if z.Signups != workers {
		t.Errorf("sign-up counters: %d; want %d (one sign-up from each of %d addresses)", z.Signups, workers, workers)
	}
	// Every lock released: the table keeps no entry for a free lock, so
	// it does not grow with the orders (one lock key each).
	if n := locks.Len(); n != 0 {
		t.Errorf("in-process lock table: %d entries after the load; want 0 (every lock released)", n)
	}
	t.Logf("after %d requests (%v): %+v, lock table %d", addrs.Load(), time.Since(began).Round(time.Millisecond), z, locks.Len())

	// More new addresses than the limiters keep: the buckets stay at most
	// MaxLimiterEntries.
	flood := uint64(httpapi.MaxLimiterEntries + 5_000)
	start := addrs.Load()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for addrs.Load() < start+flood {
				do("GET", "/api/v1/account", "", "", "")
			}
		}()
	}
	wg.Wait()
	z, _ = httpapi.Sizes(h)
	t.Logf("after %d requests from new addresses (%v): %+v", addrs.Load()-start, time.Since(began).Round(time.Millisecond), z)
	if z.Rates > httpapi.MaxLimiterEntries || z.Rates == 0 {
		t.Errorf("token buckets after %d new addresses: %d; want 1..%d", addrs.Load()-start, z.Rates, httpapi.MaxLimiterEntries)
	}
	for _, b := range bad {
		t.Error(b)
	}
}
