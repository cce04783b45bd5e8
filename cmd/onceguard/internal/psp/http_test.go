package psp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// The client and the HTTP server behave as the in-process simulator does,
// including a timeout after the money moved.
func TestHTTP(t *testing.T) {
	sim := &psp.Sim{}
	srv := httptest.NewServer(psp.Handler(sim))
	defer srv.Close()
	c := psp.NewClient(srv.URL, &http.Client{Timeout: 500 * time.Millisecond})
	ctx := context.Background()

	op, err := c.Do(ctx, psp.Charge, "dep_1", 1234)
	if err != nil || op.Status != psp.Succeeded || op.Amount != 1234 {
		t.Fatalf("Do = %+v, %v", op, err)
	}
	if again, err := c.Do(ctx, psp.Charge, "dep_1", 1234); err != nil || again.ID != op.ID {
		t.Errorf("same key = %+v, %v; want %s again", again, err, op.ID)
	}
	if _, err := c.Do(ctx, psp.Charge, "dep_1", 1); !errors.Is(err, psp.ErrKeyReused) {
		t.Errorf("reused key = %v; want ErrKeyReused", err)
	}
	if _, err := c.Lookup(ctx, "nope"); !errors.Is(err, psp.ErrNotFound) {
		t.Errorf("Lookup(unknown) = %v; want ErrNotFound", err)
	}
	resp, err := http.Post(srv.URL+"/v1/faults", "application/json", bytes.NewReader([]byte(`{"faults":["timeout_after_commit"]}`)))
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("inject = %v, %v", resp, err)
	}
	resp.Body.Close()
	if _, err := c.Do(ctx, psp.Payout, "wd_9", 500); !errors.Is(err, psp.ErrUnknownOutcome) {
		t.Fatalf("Do with a timeout after commit = %v; want ErrUnknownOutcome", err)
	}
	if op, err := c.Lookup(ctx, "wd_9"); err != nil || op.Status != psp.Succeeded {
		t.Errorf("Lookup = %+v, %v; want the payout that happened", op, err)
	}
	if n, _ := sim.Moved(psp.Payout); n != 1 {
		t.Errorf("payouts = %d; want 1", n)
	}
	// A key with the characters a URL path or query treats specially is
	// looked up as it is, not as another path.
	odd := "wd/1?x=1#y %2F"
	if _, err := c.Do(ctx, psp.Payout, odd, 7); err != nil {
		t.Fatalf("Do(%q) = %v", odd, err)
	}
	if op, err := c.Lookup(ctx, odd); err != nil || op.Key != odd {
		t.Errorf("Lookup(%q) = %+v, %v; want its payout", odd, op, err)
	}
	if resp, err := http.Post(srv.URL+"/v1/faults", "application/json", bytes.NewReader([]byte(`{"faults":["meteor"]}`))); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("inject an unknown fault = %v, %v; want 400", resp, err)
	} else {
		resp.Body.Close()
	}
	for _, body := range []string{`{`, `{"kind":"payout","amount":"1e3"}`, `{"kind":"payout","amount":"-1"}`} {
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/operations", bytes.NewReader([]byte(body)))
		r.Header.Set("Idempotency-Key", "x")
		resp, err := http.DefaultClient.Do(r)
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s = %v, %v; want 400", body, resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
}

// Close leaves the provider no connection from a client NewClient made:
// it closes the transport's idle pool, which is also where a spare
// connection the transport dialed, and never used, waits.
func TestClientCloseClosesConnections(t *testing.T) {
	var mu sync.Mutex
	open := 0
	srv := httptest.NewUnstartedServer(psp.Handler(&psp.Sim{}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case http.StateNew:
			open++
		case http.StateClosed, http.StateHijacked:
			open--
		}
	}
	srv.Start()
	defer srv.Close()
	c := psp.NewClient(srv.URL, nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Do(context.Background(), psp.Charge, fmt.Sprint("k", i), 100); err != nil {
				t.Errorf("Do = %v", err)
			}
		}()
	}
	wg.Wait()
	count := func() int { mu.Lock(); defer mu.Unlock(); return open }
	if count() == 0 {
		t.Fatal("no connection open before Close: the test proves nothing")
	}
	c.Close()
	for deadline := time.Now().Add(5 * time.Second); count() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after Close", count())
		}
	}
}
