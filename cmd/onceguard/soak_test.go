package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var soakFor = flag.Duration("soak", 8*time.Second, "how long TestSoak keeps its steady load (e.g. -soak 10m)")

// A steady mixed load for -soak: sign-ins, deposits, withdrawals with
// submit tokens, orders and payments, reads. Afterwards goroutines, open
// file descriptors (connections) and the heap return to their baseline,
// nothing answered 5xx, and every ledger sums to its balance.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: not in -short")
	}
	base, stop := startServeLogs(t, os.Stderr, "--log-level", "error")
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
		bad     sync.Map // "status code" -> count
		stopped atomic.Bool
	)
	step := func(c *client, i int) {
		send := func(method, path, key, body string) answer {
			req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+c.token)
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
	t.Logf("soak %v: %d requests; goroutines %d -> %d, open fds %d -> %d, heap %d KiB -> %d KiB", *soakFor, sent.Load(), g0, g1, f0, f1, h0>>10, h1>>10)
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
