package sqlstore_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
)

// The middleware's race guarantees, on every database: 200 identical
// requests with one key run the handler once; 50 requests with different
// keys and one body inside the repeat window are accepted once.
func TestMiddlewareStorms(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			s, err := sqlstore.New(db, d.dialect, &sqlstore.Options{Prefix: "storetest_"})
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			h := idempotency.Middleware(idempotency.Config{
				Store: s, Windows: s, Window: time.Minute,
				Principal: func(r *http.Request) (string, bool) { return r.Header.Get("X-User"), true },
			})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				time.Sleep(10 * time.Millisecond)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"ok":true}`))
			}))
			storm := func(n int, key func(i int) string, user string) map[int]int {
				var mu sync.Mutex
				codes := map[int]int{}
				var wg sync.WaitGroup
				gate := make(chan struct{})
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-gate
						r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"5"}`))
						r.Header.Set("Idempotency-Key", key(i))
						r.Header.Set("X-User", user)
						w := httptest.NewRecorder()
						h.ServeHTTP(w, r)
						mu.Lock()
						codes[w.Code]++
						mu.Unlock()
					}()
				}
				close(gate)
				wg.Wait()
				return codes
			}
			user := fmt.Sprintf("u%d", time.Now().UnixNano())
			codes := storm(200, func(int) string { return "one-key" }, user)
			if runs.Load() != 1 || codes[201] < 1 || codes[201]+codes[409] != 200 {
				t.Errorf("200 requests, one key: handler ran %d times, answers %v; want 1 run, only 201s and 409s", runs.Load(), codes)
			}
			runs.Store(0)
			codes = storm(50, func(i int) string { return fmt.Sprintf("k-%d", i) }, user+"-w")
			if runs.Load() != 1 || codes[201] != 1 || codes[429] != 49 {
				t.Errorf("50 keys, one body: handler ran %d times, answers %v; want 1 run, one 201, 49 429s", runs.Load(), codes)
			}
		})
	}
}
