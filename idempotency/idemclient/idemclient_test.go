package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// guarded is a server whose handler runs behind the idempotency middleware
// on a memstore, counting executions; release, if set, holds each execution
// until it is closed.
type guarded struct {
	srv     *httptest.Server
	runs    atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func newGuarded(t *testing.T, window time.Duration, hold bool) *guarded {
	t.Helper()
	g := &guarded{entered: make(chan struct{}, 16)}
	if hold {
		g.release = make(chan struct{})
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.runs.Add(1)
		select {
		case g.entered <- struct{}{}:
		default: // a second execution: the test reports it by the count
		}
		if g.release != nil {
			select {
			case <-g.release:
			case <-time.After(5 * time.Second): // a client that broke the key does not hang the test
			}
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"echo":`+string(body)+`}`)
	})
	cfg := idempotency.Config{Store: &memstore.Store{}, Window: window}
	g.srv = httptest.NewServer(idempotency.Middleware(cfg)(h))
	t.Cleanup(g.srv.Close)
	return g
}

// recorder is a base transport that records each attempt's key and body
// and can replace an attempt's outcome.
type recorder struct {
	base    http.RoundTripper
	mu      sync.Mutex
	keys    []string
	bodies  []string
	failing func(attempt int, r *http.Request) (lose bool) // lose: send, then report a lost connection
	landed  chan struct{}                                  // if set, gets one value as each lost attempt's answer has been read
}

func (rec *recorder) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		_ = r.Body.Close()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
	}
	rec.mu.Lock()
	rec.keys = append(rec.keys, r.Header.Get(Header))
	rec.bodies = append(rec.bodies, string(body))
	attempt := len(rec.keys)
	rec.mu.Unlock()
	base := rec.base
	if base == nil {
		base = http.DefaultTransport
	}
	if rec.failing != nil && rec.failing(attempt, r) {
		// The request reaches the server, the answer is lost on the way back.
		go func() {
			if resp, err := base.RoundTrip(r.Clone(context.WithoutCancel(r.Context()))); err == nil {
				drain(resp)
			}
			if rec.landed != nil {
				rec.landed <- struct{}{}
			}
		}()
		return nil, errors.New("connection reset by peer")
	}
	return base.RoundTrip(r)
}

func (rec *recorder) attempts() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.keys)
}

// noSleep records each wait instead of waiting, so tests take no time.
type noSleep struct {
	mu    sync.Mutex
	waits []time.Duration
	then  func() // runs during each wait
}

func (s *noSleep) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	then := s.then
	s.mu.Unlock()
	if then != nil {
		then()
	}
	return ctx.Err()
}

func post(t *testing.T, c *http.Client, url, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, string(raw)
}

func waitEntered(t *testing.T, g *guarded) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second): // only bounds a hang: a loaded CI machine took over 5 s once
		t.Error("the handler never ran")
	}
}

// waitLanded waits until a lost attempt's answer has been read: the server
// has stored it (the middleware stores an answer before it sends it).
func waitLanded(t *testing.T, rec *recorder) {
	t.Helper()
	select {
	case <-rec.landed:
	case <-time.After(30 * time.Second): // only bounds a hang
		t.Error("the lost attempt never got its answer")
	}
}

func sameKeys(t *testing.T, rec *recorder) {
	t.Helper()
	for i, k := range rec.keys {
		if k == "" || k != rec.keys[0] {
			t.Fatalf("attempt %d sent key %q; attempt 1 sent %q: every attempt must send one key", i+1, k, rec.keys[0])
		}
		if rec.bodies[i] != rec.bodies[0] {
			t.Fatalf("attempt %d sent body %q; attempt 1 sent %q", i+1, rec.bodies[i], rec.bodies[0])
		}
	}
}

// The answer to the first attempt is lost after the server ran it: the
// retry carries the same key and body and gets the stored answer.
func TestLostAnswerIsReplayed(t *testing.T) {
	g := newGuarded(t, 0, false)
	rec := &recorder{failing: func(attempt int, _ *http.Request) bool { return attempt == 1 }, landed: make(chan struct{}, 1)}
	// The lost attempt has run and its answer is stored before the retry;
	// the handler having started is not enough: a retry then gets 409.
	s := &noSleep{then: func() { waitLanded(t, rec) }}
	tr := &Transport{Base: rec, sleep: s.sleep}
	resp, body := post(t, &http.Client{Transport: tr}, g.srv.URL, `{"amount":"10.00"}`)
	if resp.StatusCode != http.StatusCreated || !Replayed(resp) {
		t.Fatalf("got %d replayed=%v %s; want the stored 201, replayed", resp.StatusCode, Replayed(resp), body)
	}
	if body != `{"echo":{"amount":"10.00"}}` {
		t.Errorf("replayed body %q", body)
	}
	if n := g.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
	if rec.attempts() != 2 {
		t.Errorf("%d attempts; want 2", rec.attempts())
	}
	sameKeys(t, rec)
	if Key(resp) != rec.keys[0] {
		t.Errorf("Key(resp) = %q; want the key sent, %q", Key(resp), rec.keys[0])
	}
}

// While the first execution is in flight a retry gets 409
// request_in_progress with Retry-After: 1; the client waits at least that
// long, retries with the same key, and ends with the stored answer.
func TestInFlightIsRetried(t *testing.T) {
	g := newGuarded(t, 0, true)
	rec := &recorder{failing: func(attempt int, _ *http.Request) bool { return attempt == 1 }, landed: make(chan struct{}, 1)}
	s := &noSleep{}
	var once sync.Once
	s.then = func() {
		s.mu.Lock()
		n := len(s.waits)
		s.mu.Unlock()
		if n == 1 {
			waitEntered(t, g) // the lost attempt is running: the next gets 409
		}
		if n == 2 {
			once.Do(func() { close(g.release) })
			waitLanded(t, rec) // the first execution has stored its answer
		}
	}
	tr := &Transport{Base: rec, sleep: s.sleep}
	resp, body := post(t, &http.Client{Transport: tr}, g.srv.URL, `{"amount":"1.00"}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("got %d %s; want 201", resp.StatusCode, body)
	}
	if n := g.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
	if rec.attempts() != 3 {
		t.Fatalf("%d attempts; want 3 (lost, 409, replay)", rec.attempts())
	}
	if s.waits[1] < time.Second {
		t.Errorf("waited %v after 409 with Retry-After: 1; want at least 1s", s.waits[1])
	}
	sameKeys(t, rec)
}

// A 429 duplicate_submission is a business refusal: returned at once, with
// its body readable.
func TestDuplicateSubmissionNotRetried(t *testing.T) {
	g := newGuarded(t, time.Minute, false)
	c := &http.Client{Transport: &Transport{sleep: (&noSleep{}).sleep}}
	if resp, body := post(t, c, g.srv.URL, `{"amount":"5.00"}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first intent: %d %s", resp.StatusCode, body)
	}
	waitEntered(t, g)
	rec := &recorder{}
	c = &http.Client{Transport: &Transport{Base: rec, sleep: (&noSleep{}).sleep}}
	resp, body := post(t, c, g.srv.URL, `{"amount":"5.00"}`)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"duplicate_submission"`) {
		t.Fatalf("second intent, same body: %d %s; want 429 duplicate_submission", resp.StatusCode, body)
	}
	if rec.attempts() != 1 {
		t.Errorf("%d attempts; want 1: a duplicate submission is never retried", rec.attempts())
	}
	if n := g.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
}

// fixed answers each attempt with the next of its statuses.
func fixed(t *testing.T, answers ...func(w http.ResponseWriter)) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		if i >= len(answers) {
			i = len(answers) - 1
		}
		answers[i](w)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func problem(status int, code, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/problem+json")
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"type":"about:blank","status":`+strconv.Itoa(status)+`,"code":"`+code+`"}`)
	}
}

func created(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }

// Which answers are retried, and how long the client waits before each retry.
func TestRetriedAnswers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		first    func(w http.ResponseWriter)
		retried  bool
		minWait  time.Duration
		wantCode int
	}{
		{"503 with Retry-After", problem(503, "store_unavailable", "2"), true, 2 * time.Second, 201},
		{"503 with a date", problem(503, "store_unavailable", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat)), true, time.Second, 201},
		{"429 rate_limited", problem(429, "rate_limited", "4"), true, 4 * time.Second, 201},
		{"409 request_in_progress", problem(409, "request_in_progress", "1"), true, time.Second, 201},
		{"409 idempotency_key_mismatch", problem(409, "idempotency_key_mismatch", ""), false, 0, 409},
		{"422 mismatch", problem(422, "idempotency_key_mismatch", ""), false, 0, 422},
		{"429 duplicate_submission", problem(429, "duplicate_submission", "9"), false, 0, 429},
		{"500", problem(500, "internal", ""), false, 0, 500},
		{"400 invalid key", problem(400, "idempotency_key_invalid", ""), false, 0, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, n := fixed(t, tc.first, created)
			s := &noSleep{}
			c := &http.Client{Transport: &Transport{sleep: s.sleep}}
			resp, body := post(t, c, srv.URL, `{}`)
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("got %d %s; want %d", resp.StatusCode, body, tc.wantCode)
			}
			if want := map[bool]int32{true: 2, false: 1}[tc.retried]; n.Load() != want {
				t.Fatalf("%d attempts; want %d", n.Load(), want)
			}
			if tc.retried && s.waits[0] < tc.minWait {
				t.Errorf("waited %v; want at least %v (Retry-After)", s.waits[0], tc.minWait)
			}
			if !tc.retried && !strings.Contains(body, `"code"`) {
				t.Errorf("the returned answer's body was consumed: %q", body)
			}
		})
	}
}

// Transport errors on every attempt: the error says the outcome is unknown
// and carries the key, to retry the same intent later; the waits back off.
func TestOutcomeUnknown(t *testing.T) {
	rec := &recorder{base: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, errors.New("connection refused")
	})}
	s := &noSleep{}
	c := &http.Client{Transport: &Transport{Base: rec, MaxAttempts: 4, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, sleep: s.sleep}}
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", strings.NewReader(`{"a":1}`))
	_, err := c.Do(req)
	var e *Error
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.As(err, &e) {
		t.Fatalf("err = %v; want an *Error wrapping ErrOutcomeUnknown", err)
	}
	if e.Attempts != 4 || rec.attempts() != 4 || e.Key != rec.keys[0] {
		t.Errorf("Error = %+v after %d attempts with key %q", e, rec.attempts(), rec.keys[0])
	}
	sameKeys(t, rec)
	if len(s.waits) != 3 {
		t.Fatalf("%d waits; want 3", len(s.waits))
	}
	for i, w := range s.waits {
		if w < 50*time.Millisecond || w > time.Second {
			t.Errorf("wait %d = %v; want within [MinBackoff/2, MaxBackoff]", i, w)
		}
	}
}

// A wait that would pass MaxElapsed ends the retries with the last answer.
func TestDeadline(t *testing.T) {
	srv, n := fixed(t, problem(503, "store_unavailable", "60"), created)
	c := &http.Client{Transport: &Transport{MaxElapsed: 10 * time.Second, sleep: (&noSleep{}).sleep}}
	resp, _ := post(t, c, srv.URL, `{}`)
	if resp.StatusCode != 503 || n.Load() != 1 {
		t.Fatalf("got %d after %d attempts; want the 503 after 1 (Retry-After 60s > MaxElapsed)", resp.StatusCode, n.Load())
	}
	// The request's context bounds the retries too.
	ctx, cancel := context.WithCancel(context.Background())
	srv, _ = fixed(t, problem(503, "store_unavailable", "1"))
	s := &noSleep{then: cancel}
	c = &http.Client{Transport: &Transport{sleep: s.sleep}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
	_, err := c.Do(req)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("err = %v; want context.Canceled and ErrOutcomeUnknown", err)
	}
}

// A caller's own key is kept; GET passes through once without a key; a
// body without GetBody is buffered and sent whole on each attempt.
func TestKeysAndBodies(t *testing.T) {
	srv, _ := fixed(t, problem(503, "store_unavailable", "0"), created)
	rec := &recorder{}
	c := &http.Client{Transport: &Transport{Base: rec, sleep: (&noSleep{}).sleep}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader(`{"big":"`+strings.Repeat("x", 100<<10)+`"}`)))
	req.Header.Set(Header, "order-42")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || rec.attempts() != 2 || rec.keys[0] != "order-42" {
		t.Fatalf("got %d after %d attempts, keys %v; want 201 after 2 with the caller's key", resp.StatusCode, rec.attempts(), rec.keys)
	}
	sameKeys(t, rec)
	if len(rec.bodies[1]) < 100<<10 {
		t.Errorf("the retry sent %d bytes; want the whole body", len(rec.bodies[1]))
	}

	rec = &recorder{}
	srv, n := fixed(t, problem(503, "store_unavailable", "0"))
	c = &http.Client{Transport: &Transport{Base: rec, sleep: (&noSleep{}).sleep}}
	resp, err = c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n.Load() != 1 || rec.keys[0] != "" {
		t.Errorf("GET: %d attempts, key %q; want 1 attempt without a key", n.Load(), rec.keys[0])
	}

	big := &Transport{MaxBody: 10, sleep: (&noSleep{}).sleep}
	req, _ = http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader(strings.Repeat("y", 11))))
	if _, err := big.RoundTrip(req); !errors.Is(err, ErrBodyTooLarge) {
		t.Errorf("an 11-byte body over MaxBody 10: err = %v; want ErrBodyTooLarge", err)
	}
}

// NewKey mints distinct keys the middleware accepts; a NewKey hook is used
// for requests without a key, and its error is returned.
func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		k := NewKey()
		if _, err := idempotency.ParseKey([]string{k}); err != nil || seen[k] {
			t.Fatalf("NewKey() = %q: err %v, seen %v", k, err, seen[k])
		}
		seen[k] = true
	}
	srv, _ := fixed(t, created)
	rec := &recorder{}
	c := &http.Client{Transport: &Transport{Base: rec, NewKey: func(*http.Request) (string, error) { return "st_minted", nil }}}
	resp, _ := post(t, c, srv.URL, `{}`)
	if resp.StatusCode != 201 || rec.keys[0] != "st_minted" {
		t.Errorf("got %d with key %q; want the hook's key", resp.StatusCode, rec.keys[0])
	}
	boom := errors.New("token endpoint down")
	c = &http.Client{Transport: &Transport{NewKey: func(*http.Request) (string, error) { return "", boom }}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	if _, err := c.Do(req); !errors.Is(err, boom) {
		t.Errorf("err = %v; want the hook's error", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Offers: a request without a key takes the newest unexpired offer of its
// route (method, host, path), once; the answers' offers are kept, the
// retried attempt's too; a request with its own key, another route, an
// offer about to expire and a route with none fall back to NewKey; at most
// MaxOffers are kept per route.
func TestOffers(t *testing.T) {
	var n atomic.Int32
	var ttl atomic.Int64 // the offers' lifetime
	ttl.Store(int64(time.Minute))
	var conflictFirst atomic.Bool // the next request's first attempt: 409 in progress
	var silent atomic.Bool        // no offers
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !silent.Load() {
			w.Header().Set("Next-Submit-Token", "st_"+strconv.Itoa(int(n.Add(1))))
			w.Header().Set("Next-Submit-Token-Expires", time.Now().Add(time.Duration(ttl.Load())).UTC().Format(time.RFC3339))
		}
		if conflictFirst.Swap(false) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"code":"request_in_progress"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	rec, tr := offersTransport()
	post := func(path, key string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		if key != "" {
			req.Header.Set(Header, key)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
	}
	sent := func(from int) []string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return append([]string(nil), rec.keys[from:]...)
	}
	expect := func(from int, want ...string) {
		t.Helper()
		if got := sent(from); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("keys sent %v; want %v", got, want)
		}
	}

	post("/pay", "")        // no offer yet: a mint; offers st_1
	post("/pay", "")        // st_1, offers st_2
	post("/pay", "")        // st_2, offers st_3
	post("/other", "")      // another route: a mint
	post("/pay", "own-key") // its own key; its offer (st_5) is kept
	post("/pay", "")        // st_5, offers st_6
	conflictFirst.Store(true)
	post("/pay", "") // st_6 on both attempts, offering st_7 (with the 409) and st_8
	post("/pay", "") // the newest: st_8
	expect(0, "minted-1", "st_1", "st_2", "minted-2", "own-key", "st_5", "st_6", "st_6", "st_8")
	// Held now for /pay: st_3, st_7, st_9. Offers about to expire are not
	// given out: the older ones are, then a mint.
	ttl.Store(int64(OfferMargin / 2))
	post("/pay", "") // st_9; its offer st_10 expires too soon
	post("/pay", "") // st_7 (st_10 dropped)
	post("/pay", "") // st_3
	post("/pay", "") // a mint
	expect(9, "st_9", "st_7", "st_3", "minted-3")

	// At most MaxOffers per route, the newest.
	ttl.Store(int64(time.Minute))
	n.Store(100)
	for range MaxOffers + 3 {
		post("/burst", "own") // offers st_101 ... st_111
	}
	silent.Store(true)
	from := len(sent(0))
	for range MaxOffers + 1 {
		post("/burst", "")
	}
	var want []string
	for i := 111; i > 111-MaxOffers; i-- {
		want = append(want, "st_"+strconv.Itoa(i))
	}
	expect(from, append(want, "minted-4")...)
}

// offersTransport is a Transport that keeps offers and mints minted-1,
// minted-2, ..., without sleeping between attempts, over a recorder.
func offersTransport() (*recorder, *Transport) {
	rec := &recorder{}
	var minted atomic.Int32
	return rec, &Transport{Base: rec, Offers: &Offers{}, sleep: func(context.Context, time.Duration) error { return nil },
		NewKey: func(*http.Request) (string, error) { return "minted-" + strconv.Itoa(int(minted.Add(1))), nil }}
}

// An offer is for its route, the method, host and path of the request
// whose answer carried it: another host (a token of one service's, useless
// and not to be shown to another) or another method on the same path gets
// a key of its own.
func TestOffersStayOnTheirRoute(t *testing.T) {
	offering := func(name string) *httptest.Server {
		var n atomic.Int32
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Next-Submit-Token", "st_"+name+strconv.Itoa(int(n.Add(1))))
			w.Header().Set("Next-Submit-Token-Expires", time.Now().Add(time.Minute).UTC().Format(time.RFC3339))
			w.WriteHeader(http.StatusCreated)
		}))
	}
	a, b := offering("a"), offering("b")
	defer a.Close()
	defer b.Close()
	rec, tr := offersTransport()
	send := func(method, url string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(`{}`))
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
	}
	send(http.MethodPost, a.URL+"/pay")  // a mint; A offers st_a1
	send(http.MethodPost, b.URL+"/pay")  // another host: a mint; B offers st_b1
	send(http.MethodPatch, a.URL+"/pay") // another method: a mint; A offers st_a2
	send(http.MethodPost, a.URL+"/pay")  // A's offer to POST /pay
	send(http.MethodPost, b.URL+"/pay")  // B's
	send(http.MethodPatch, a.URL+"/pay") // A's offer to PATCH /pay
	rec.mu.Lock()
	got := strings.Join(rec.keys, " ")
	rec.mu.Unlock()
	if want := "minted-1 minted-2 minted-3 st_a1 st_b1 st_a2"; got != want {
		t.Fatalf("keys sent %s; want %s", got, want)
	}
}
