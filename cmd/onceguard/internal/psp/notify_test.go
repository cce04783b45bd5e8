package psp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/onceguard/onceguard/webhook"
)

// receiver records the callbacks it gets: each delivery's event id, type
// and whether its signature verified; it answers fail(n) for the nth.
type receiver struct {
	mu         sync.Mutex
	deliveries []delivery
	fail       func(n int) bool
	got        chan struct{}
	onDelivery func(psp.Event) // if set, told of each delivery once it is recorded
}

type delivery struct {
	ev       psp.Event
	verified bool
}

func newReceiver(t *testing.T, fail func(int) bool) (*receiver, *httptest.Server) {
	rc := &receiver{fail: fail, got: make(chan struct{}, 1000)}
	v := webhook.Onceguard{Secrets: [][]byte{[]byte("whsec_test")}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev psp.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("callback body %q: %v", body, err)
		}
		rc.mu.Lock()
		rc.deliveries = append(rc.deliveries, delivery{ev, v.Verify(r.Header, body, time.Now()) == nil})
		n := len(rc.deliveries)
		told := rc.onDelivery
		rc.mu.Unlock()
		if told != nil {
			told(ev)
		}
		if rc.fail != nil && rc.fail(n) {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusNoContent)
		}
		rc.got <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	return rc, srv
}

// wait waits for n deliveries in all.
func (rc *receiver) wait(t *testing.T, n int) []delivery {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		rc.mu.Lock()
		got := append([]delivery(nil), rc.deliveries...)
		rc.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-rc.got:
		case <-timeout:
			t.Fatalf("%d deliveries; want %d", len(got), n)
		}
	}
}

// noLeaks checks at the test's end, after every cleanup registered later,
// that no goroutine started since is left.
func noLeaks(t *testing.T) {
	before := leakcheck.IgnoreCurrent()
	t.Cleanup(func() { leakcheck.VerifyNone(t, before) })
}

// startSim runs sim until the test ends; Run must stop all its goroutines.
func startSim(t *testing.T, sim *psp.Sim) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		sim.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func notifier(url string) *psp.Notifier {
	return &psp.Notifier{URL: url, Secret: []byte("whsec_test"), MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Delay: 50 * time.Millisecond}
}

// An async operation answers pending, settles later, and calls back once,
// signed; a failed delivery is redelivered with the same event id; the
// operation's key stays idempotent throughout.
func TestAsyncNotify(t *testing.T) {
	noLeaks(t)
	rc, srv := newReceiver(t, func(n int) bool { return n <= 3 }) // the first 3 deliveries fail
	sim := &psp.Sim{Async: true, SettleAfter: 10 * time.Millisecond, Notifier: notifier(srv.URL)}
	startSim(t, sim)
	ctx := context.Background()
	op, err := sim.Do(ctx, psp.Payout, "wd_1", 500)
	if err != nil || op.Status != psp.Pending {
		t.Fatalf("Do = %+v, %v; want pending", op, err)
	}
	if again, err := sim.Do(ctx, psp.Payout, "wd_1", 500); err != nil || again.ID != op.ID {
		t.Errorf("Do again = %+v, %v; want %s", again, err, op.ID)
	}
	got := rc.wait(t, 4)
	for i, d := range got {
		if d.ev.ID != got[0].ev.ID || !d.verified || d.ev.Type != psp.EventSucceeded || d.ev.Operation.Key != "wd_1" || d.ev.Operation.Status != psp.Succeeded {
			t.Errorf("delivery %d = %+v; want event %s, signed, succeeded for wd_1", i, d, got[0].ev.ID)
		}
	}
	if op, err := sim.Lookup(ctx, "wd_1"); err != nil || op.Status != psp.Succeeded {
		t.Errorf("Lookup after settling = %+v, %v; want succeeded", op, err)
	}
	if n, total := sim.Moved(psp.Payout); n != 1 || total != 500 {
		t.Errorf("Moved = %d, %v; want 1, 5.00", n, total)
	}
}

// The four callback faults, each on the next callback.
func TestNotifyFaults(t *testing.T) {
	noLeaks(t)
	rc, srv := newReceiver(t, nil)
	// notify_delay's callback is held until the next operation's has
	// arrived (a fixed delay would race it on a loaded machine): what is
	// checked is that it is still delivered, and that holding it holds
	// back no other callback.
	overtaken := make(chan struct{})
	var once sync.Once
	rc.mu.Lock()
	rc.onDelivery = func(ev psp.Event) {
		if ev.Operation.Key == "after" {
			once.Do(func() { close(overtaken) })
		}
	}
	rc.mu.Unlock()
	n := notifier(srv.URL)
	n.Hold = func(ctx context.Context) bool {
		select {
		case <-overtaken:
			return true
		case <-ctx.Done():
			return false
		}
	}
	sim := &psp.Sim{Notifier: n}
	startSim(t, sim)
	ctx := context.Background()
	do := func(key string, faults ...psp.Fault) {
		t.Helper()
		sim.Inject(faults...)
		if _, err := sim.Do(ctx, psp.Charge, key, 100); err != nil {
			t.Fatal(err)
		}
	}
	do("dup", psp.NotifyDuplicate)
	byKey := func(got []delivery, key string) (n, verified int) {
		for _, d := range got {
			if d.ev.Operation.Key == key {
				n++
				if d.verified {
					verified++
				}
			}
		}
		return n, verified
	}
	if n, _ := byKey(rc.wait(t, 5), "dup"); n != 5 {
		t.Errorf("notify_duplicate: %d deliveries; want 5", n)
	}
	do("dropped", psp.NotifyDrop)
	do("bad", psp.NotifyBadSignature) // its first delivery is unverified (and answered 204 here)
	got := rc.wait(t, 6)
	if n, v := byKey(got, "bad"); n != 1 || v != 0 {
		t.Errorf("notify_bad_signature: %d deliveries, %d verified; want the first, unverified", n, v)
	}
	do("delayed", psp.NotifyDelay)
	do("after") // overtakes the delayed one
	got = rc.wait(t, 8)
	if last := got[len(got)-1].ev.Operation.Key; last != "delayed" {
		t.Errorf("last delivery for %q; want the delayed one after its successor", last)
	}
	if n, _ := byKey(got, "dropped"); n != 0 {
		t.Errorf("notify_drop: %d deliveries; want none", n)
	}
	if n, _ := byKey(got, "after"); n != 1 {
		t.Errorf("a callback without a fault: %d deliveries; want 1", n)
	}
	ids := map[string]bool{}
	for _, d := range got {
		ids[d.ev.ID] = true
	}
	if len(ids) != 4 { // dup, bad, delayed, after
		t.Errorf("%d event ids; want 4, one per operation delivered", len(ids))
	}
}

// notify_bad_signature's redelivery is signed correctly (the receiver
// above answers 204 to the bad one, as one that does not verify would not).
func TestNotifyBadSignatureRedelivered(t *testing.T) {
	noLeaks(t)
	v := webhook.Onceguard{Secrets: [][]byte{[]byte("whsec_test")}}
	var mu sync.Mutex
	var verified []bool
	got := make(chan struct{}, 10)
	srv := httptest.NewServer(webhook.Handler(webhook.Config{Verifier: v, OnReject: func(*http.Request, error) {
		mu.Lock()
		verified = append(verified, false)
		mu.Unlock()
	}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		verified = append(verified, true)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		got <- struct{}{}
	})))
	t.Cleanup(srv.Close)
	sim := &psp.Sim{Notifier: notifier(srv.URL)}
	startSim(t, sim)
	sim.Inject(psp.NotifyBadSignature)
	if _, err := sim.Do(context.Background(), psp.Charge, "k", 100); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no verified delivery")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(verified) != 2 || verified[0] || !verified[1] {
		t.Errorf("deliveries verified %v; want [false true]", verified)
	}
}

// The default backoff redelivers at least 10 times over at least a minute.
func TestNotifyBackoff(t *testing.T) {
	var n psp.Notifier
	var total time.Duration
	for i := 1; i <= 10; i++ {
		d := n.Backoff(i)
		if d <= 0 || (i > 1 && d < n.Backoff(i-1)) {
			t.Errorf("Backoff(%d) = %v; want positive, not below Backoff(%d) = %v", i, d, i-1, n.Backoff(i-1))
		}
		total += d
	}
	if total < time.Minute {
		t.Errorf("the first 10 redeliveries wait %v in all; want at least a minute", total)
	}
	if d := n.Backoff(100); d != 30*time.Second {
		t.Errorf("Backoff(100) = %v; want the 30s cap", d)
	}
}

// The faults endpoint takes the callback faults.
func TestHTTPNotifyFaults(t *testing.T) {
	srv := httptest.NewServer(psp.Handler(&psp.Sim{}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/faults", "application/json",
		bytes.NewReader([]byte(`{"faults":["notify_duplicate","notify_delay","notify_drop","notify_bad_signature"]}`)))
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("inject = %v, %v; want 204", resp, err)
	}
	resp.Body.Close()
}

// Run's end stops a settlement that has not come yet and a redelivery
// waiting its backoff, and leaves no goroutine.
func TestRunStopsItsWork(t *testing.T) {
	noLeaks(t)
	rc, srv := newReceiver(t, func(int) bool { return true }) // never answered 2xx
	n := notifier(srv.URL)
	n.MinBackoff = time.Hour
	sim := &psp.Sim{Async: true, SettleAfter: time.Millisecond, Notifier: n}
	startSim(t, sim)
	if _, err := sim.Do(context.Background(), psp.Charge, "k1", 100); err != nil {
		t.Fatal(err)
	}
	rc.wait(t, 1)
	sim.SettleAfter = time.Hour // the next one never settles before the end
	if _, err := sim.Do(context.Background(), psp.Charge, "k2", 100); err != nil {
		t.Fatal(err)
	}
}
