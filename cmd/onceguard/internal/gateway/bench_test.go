package gateway_test

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/idempotency/memstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// BenchmarkGateway prints, as go test -bench's table, a guarded request's
// cost through the gateway next to a plain httputil.ReverseProxy in front
// of the same upstream: ns/op at 1 client is the latency (the gateway's
// added latency is the difference), cpu-us/op the process's CPU per
// request (client, proxy and upstream all run in this process: the
// difference is the gateway's), req/s the throughput at 1, 16 and 64
// clients. Every request has a new key (the whole path: record created,
// answer stored). Run:
//
//	go test -run '^$' -bench BenchmarkGateway -benchtime 2000x ./cmd/onceguard/internal/gateway
func BenchmarkGateway(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":1,"status":"succeeded"}`)
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	route, _ := gateway.ParseRoute("POST /pay")
	gw := func(b *testing.B, keys func(b *testing.B) gateway.Config) http.Handler {
		cfg := keys(b)
		cfg.Upstream, cfg.Routes, cfg.PrincipalHeader = target, []gateway.Route{route}, "X-User-Id"
		g, err := gateway.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	variants := []struct {
		name  string
		front func(b *testing.B) http.Handler
	}{
		{"reverseproxy", func(*testing.B) http.Handler {
			return &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.SetXForwarded() },
				Transport: gateway.NewTransport(30 * time.Second)}
		}},
		{"gateway-memstore", func(b *testing.B) http.Handler {
			return gw(b, func(*testing.B) gateway.Config { return gateway.Config{Keys: &memstore.Store{}} })
		}},
		{"gateway-sqlite", func(b *testing.B) http.Handler {
			return gw(b, func(b *testing.B) gateway.Config {
				path := filepath.Join(b.TempDir(), "keys.db")
				db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = db.Close() })
				s, err := idemsql.New(db, sqldialect.SQLite, nil)
				if err != nil {
					b.Fatal(err)
				}
				return gateway.Config{Keys: s}
			})
		}},
	}
	for _, clients := range []int{1, 16, 64} {
		for _, v := range variants {
			b.Run(fmt.Sprintf("%s/clients=%d", v.name, clients), func(b *testing.B) {
				front := httptest.NewServer(v.front(b))
				defer front.Close()
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients}}
				var seq atomic.Int64
				var failed atomic.Int64
				cpu0 := cpuTime()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							n := seq.Add(1)
							if n > int64(b.N) {
								return
							}
							req, _ := http.NewRequest("POST", front.URL+"/pay", strings.NewReader(fmt.Sprintf(`{"amount":"%d.00"}`, n)))
							req.Header.Set("Content-Type", "application/json")
							req.Header.Set("X-User-Id", "bench")
							req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%d", n))
							resp, err := client.Do(req)
							if err != nil {
								failed.Add(1)
								continue
							}
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != http.StatusCreated {
								failed.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				if f := failed.Load(); f > 0 {
					b.Fatalf("%d of %d requests failed", f, b.N)
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
			})
		}
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
