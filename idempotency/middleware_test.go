package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// bank is a handler whose effect is guarded by a unique constraint on
// (user, key), as the service's tables are: it counts executions and
// effects separately.
type bank struct {
	mu      sync.Mutex
	effects map[string]int // (user, key) -> times the effect was applied
	runs    atomic.Int32
	delay   time.Duration
	status  int
}

func (b *bank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.runs.Add(1)
	time.Sleep(b.delay)
	call, _ := idempotency.FromContext(r.Context())
	user := r.Header.Get("X-User")
	b.mu.Lock()
	if b.effects == nil {
		b.effects = map[string]int{}
	}
	uk := user + "\x00" + call.Key
	dup := b.effects[uk] > 0
	if !dup {
		b.effects[uk]++
	}
	n := len(b.effects)
	b.mu.Unlock()
	status := b.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Set-Cookie", "secret=1")
	w.Header().Set("Location", fmt.Sprintf("/things/%d", n))
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"id":"%d","duplicate":%v}`, n, dup)
}

type env struct {
	store   *memstore.Store
	tokens  *token.Tokens
	handler http.Handler
	bank    *bank
	events  sync.Map
}

func newEnv(t *testing.T, mod func(*idempotency.Config)) *env {
	t.Helper()
	e := &env{store: &memstore.Store{}, bank: &bank{}}
	e.tokens = token.New(e.store, nil)
	cfg := idempotency.Config{
		Store: e.store, Tokens: e.tokens, Purpose: "withdrawal",
		Principal: func(r *http.Request) (string, error) {
			switch u := r.Header.Get("X-User"); u {
			case "":
				return "", errors.New("no session")
			case "session-store-down":
				return "", &idempotency.Problem{Status: 503, Code: "store_unavailable", Title: "Service unavailable"}
			default:
				return u, nil
			}
		},
		OnEvent: func(_ *http.Request, ev string) {
			v, _ := e.events.LoadOrStore(ev, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	e.handler = idempotency.Middleware(cfg)(e.bank)
	return e
}

func (e *env) count(ev string) int32 {
	v, ok := e.events.Load(ev)
	if !ok {
		return 0
	}
	return v.(*atomic.Int32).Load()
}

func (e *env) do(user, path, key, body string, extra ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if user != "" {
		r.Header.Set("X-User", user)
	}
	if key != "\x00" {
		r.Header.Add("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		r.Header.Add(extra[i], extra[i+1])
	}
	w := httptest.NewRecorder()
	e.handler.ServeHTTP(w, r)
	return w
}

func code(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var p struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		return ""
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body.String(), err)
	}
	if p.Status != w.Code {
		t.Errorf("problem status %d in a %d answer", p.Status, w.Code)
	}
	return p.Code
}

func TestFirstUseAndReplay(t *testing.T) {
	e := newEnv(t, nil)
	first := e.do("alice", "/withdrawals", "k-1", `{"amount":"10.00","note":"x"}`)
	if first.Code != http.StatusCreated {
		t.Fatalf("first = %d %s; want 201", first.Code, first.Body)
	}
	again := e.do("alice", "/withdrawals", `"k-1"`, ` { "note" : "x", "amount":"10.00" } `)
	if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() {
		t.Errorf("replay = %d %q; want the first answer %d %q", again.Code, again.Body, first.Code, first.Body)
	}
	if got := again.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("Idempotent-Replayed = %q; want true", got)
	}
	if got := again.Header().Get("Set-Cookie"); got != "" {
		t.Errorf("replayed Set-Cookie %q; want none", got)
	}
	if got, want := again.Header().Get("Location"), first.Header().Get("Location"); got != want {
		t.Errorf("replayed Location = %q; want %q", got, want)
	}
	if n := e.bank.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
	if w := e.do("alice", "/withdrawals", "k-1", `{"amount":"11.00","note":"x"}`); w.Code != 422 || code(t, w) != "idempotency_key_reused" {
		t.Errorf("same key, other body = %d %q; want 422 idempotency_key_reused", w.Code, code(t, w))
	}
	// Another user's identical key is another request: never their answer.
	if w := e.do("bob", "/withdrawals", "k-1", `{"amount":"10.00","note":"x"}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("bob with alice's key = %d replayed=%q; want a fresh 201", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	// So is the same key on another path.
	if w := e.do("alice", "/orders/B/payment", "k-1", `{"amount":"10.00","note":"x"}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("same key on another path = %d; want a fresh 201", w.Code)
	}
	if e.count("new") != 3 || e.count("replayed") != 1 || e.count("mismatch") != 1 {
		t.Errorf("events new=%d replayed=%d mismatch=%d; want 3, 1, 1", e.count("new"), e.count("replayed"), e.count("mismatch"))
	}
}

// Pitfall 19: a handler's credentials and custom headers never reach a
// replay, nor the stored record: only the allow-listed headers
// (Config.ReplayHeaders, by default Content-Type, Content-Language,
// Location) are kept. Both ways of storing an answer: by the middleware,
// and by the handler itself through Call.Response (as CompleteTx does).
func TestReplayWithholdsSecretHeaders(t *testing.T) {
	secrets := map[string]string{
		"Authorization": "Bearer sekrit-authorization",
		"X-Api-Token":   "sekrit-api-token",
		"Set-Cookie":    "session=sekrit-cookie; HttpOnly; SameSite=Strict",
		"X-Secret":      "sekrit-custom",
	}
	allowed := map[string]bool{"Content-Type": true, "Content-Language": true, "Location": true, "Idempotent-Replayed": true, "Cache-Control": true}
	const body = `{"id":"1"}`
	for _, selfComplete := range []bool{false, true} {
		t.Run(fmt.Sprintf("handler completes=%v", selfComplete), func(t *testing.T) {
			store := &memstore.Store{}
			h := idempotency.Middleware(idempotency.Config{
				Store:     store,
				Principal: func(r *http.Request) (string, error) { return "alice", nil },
			})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range secrets {
					w.Header().Set(k, v)
				}
				w.Header().Set("Content-Type", "application/json")
				if selfComplete {
					call, _ := idempotency.FromContext(r.Context())
					resp := call.Response(http.StatusCreated, w.Header(), []byte(body))
					if err := store.Complete(r.Context(), call.ID, call.Lease, resp, time.Now()); err != nil {
						t.Errorf("Complete = %v", err)
					}
					call.MarkCompleted()
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, body)
			}))
			send := func() *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"1"}`))
				r.Header.Set("Idempotency-Key", "k")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			first := send()
			if first.Code != http.StatusCreated || first.Header().Get("Set-Cookie") == "" || first.Header().Get("X-Secret") == "" {
				t.Fatalf("first = %d %v; want the handler's 201 with its own headers", first.Code, first.Header())
			}
			again := send()
			if again.Code != http.StatusCreated || again.Body.String() != body || again.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay = %d %q %v; want the stored 201", again.Code, again.Body, again.Header())
			}
			if got := again.Header().Get("Content-Type"); got != "application/json" {
				t.Errorf("replayed Content-Type = %q; want application/json (allow-listed)", got)
			}
			for k, v := range again.Header() {
				if !allowed[k] {
					t.Errorf("replay carries %s: %q; only allow-listed headers may be replayed", k, v)
				}
				for _, s := range v {
					if strings.Contains(s, "sekrit") {
						t.Errorf("replay carries a secret in %s: %q", k, s)
					}
				}
			}
			// Nor is any secret at rest in the stored record.
			fp, _ := idempotency.Fingerprint([]byte(`{"amount":"1"}`))
			id := idempotency.RecordID(idempotency.Scope{Principal: "alice", Method: http.MethodPost, Path: "/withdrawals"}, "k")
			res, err := store.Begin(context.Background(), idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
			if err != nil || res.Outcome != idemstore.Replay || res.Record == nil || res.Record.Response == nil {
				t.Fatalf("Begin of the stored key = %+v, %v; want Replay", res, err)
			}
			for k, v := range res.Record.Response.Header {
				if k != "Content-Type" {
					t.Errorf("stored record keeps %s: %q; want only Content-Type", k, v)
				}
			}
		})
	}
}

func TestKeySyntax(t *testing.T) {
	e := newEnv(t, nil)
	long := strings.Repeat("k", 255)
	for _, tc := range []struct {
		name   string
		key    string
		extra  []string
		status int
		code   string
	}{
		{"absent", "\x00", nil, 400, "idempotency_key_missing"},
		{"empty", "", nil, 400, "idempotency_key_missing"},
		{"two headers", "a", []string{"Idempotency-Key", "b"}, 400, "idempotency_key_invalid"},
		{"space", "a b", nil, 400, "idempotency_key_invalid"},
		{"quote inside", `a"b`, nil, 400, "idempotency_key_invalid"},
		{"empty quoted", `""`, nil, 400, "idempotency_key_invalid"},
		{"too long", long + "k", nil, 400, "idempotency_key_invalid"},
		{"non-ascii", "kä", nil, 400, "idempotency_key_invalid"},
		{"longest", long, nil, 201, ""},
		{"longest quoted", `"` + strings.Repeat("q", 255) + `"`, nil, 201, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := e.do("alice", "/withdrawals", tc.key, `{"amount":"1"}`, tc.extra...)
			if w.Code != tc.status || code(t, w) != tc.code {
				t.Errorf("= %d %q; want %d %q", w.Code, code(t, w), tc.status, tc.code)
			}
		})
	}
}

func TestOrderOfChecks(t *testing.T) {
	e := newEnv(t, nil)
	big := `{"a":"` + strings.Repeat("x", 64<<10) + `"}`
	for _, tc := range []struct {
		name, user, key, body string
		status                int
		code                  string
	}{
		{"too large before auth and key", "", "\x00", big, 413, "body_too_large"},
		{"auth before key", "", "\x00", `{}`, 401, "unauthenticated"},
		{"a session store error is its problem, not 401", "session-store-down", "k", `{}`, 503, "store_unavailable"},
		{"key before body", "alice", "\x00", `not json`, 400, "idempotency_key_missing"},
		{"body", "alice", "k", `{"a":1,"a":2}`, 400, "invalid_json"},
		{"body not json", "alice", "k", `{`, 400, "invalid_json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := e.do(tc.user, "/withdrawals", tc.key, tc.body)
			if w.Code != tc.status || code(t, w) != tc.code {
				t.Errorf("= %d %q; want %d %q", w.Code, code(t, w), tc.status, tc.code)
			}
		})
	}
	// None of these used the key.
	if w := e.do("alice", "/withdrawals", "k", `{"a":1}`); w.Code != 201 {
		t.Errorf("the key after refused requests = %d; want 201", w.Code)
	}
}

func TestConcurrentSameKey(t *testing.T) {
	e := newEnv(t, nil)
	e.bank.delay = 20 * time.Millisecond
	const n = 200
	var wg sync.WaitGroup
	answers := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = e.do("alice", "/withdrawals", "storm", `{"amount":"5"}`)
		}()
	}
	close(start)
	wg.Wait()
	if runs := e.bank.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times for one key; want 1", runs)
	}
	var created, conflicts, replays int
	var body string
	for _, w := range answers {
		switch {
		case w.Code == 201 && w.Header().Get("Idempotent-Replayed") == "":
			created++
			body = w.Body.String()
		case w.Code == 201:
			replays++
		case w.Code == 409 && code(t, w) == "request_in_progress" && w.Header().Get("Retry-After") == "1":
			conflicts++
		default:
			t.Errorf("answer %d %s; want 201, a replay or 409", w.Code, w.Body)
		}
	}
	for _, w := range answers {
		if w.Code == 201 && w.Body.String() != body {
			t.Errorf("replay %q differs from the first answer %q", w.Body, body)
		}
	}
	if created != 1 {
		t.Errorf("%d fresh answers; want 1 (replays %d, 409s %d)", created, replays, conflicts)
	}
}

func TestRepeatWindow(t *testing.T) {
	e := newEnv(t, func(c *idempotency.Config) {
		c.Windows = nil // set below, sharing the store
		c.Window = 10 * time.Second
	})
	e.handler = idempotency.Middleware(idempotency.Config{
		Store: e.store, Windows: e.store, Window: 10 * time.Second,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
	})(e.bank)
	const n = 50
	var wg sync.WaitGroup
	answers := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = e.do("alice", "/withdrawals", fmt.Sprintf("key-%d", i), `{"amount":"5"}`)
		}()
	}
	close(start)
	wg.Wait()
	var (
		ok      int
		dupKeys []string
	)
	for i, w := range answers {
		switch {
		case w.Code == 201:
			ok++
		case w.Code == 429 && code(t, w) == "duplicate_submission":
			if ra := w.Header().Get("Retry-After"); ra == "" || ra == "0" {
				t.Errorf("429 with Retry-After %q; want whole seconds left", ra)
			}
			dupKeys = append(dupKeys, fmt.Sprintf("key-%d", i))
		default:
			t.Errorf("answer %d %s", w.Code, w.Body)
		}
	}
	if ok != 1 || len(dupKeys) != n-1 {
		t.Fatalf("accepted %d, 429 %d; want 1, %d", ok, len(dupKeys), n-1)
	}
	// A 429 recorded nothing and left its key free (PITFALLS 18, 21): the
	// same key and body are refused by the window again, not held in
	// flight (409), and the same key with another body runs.
	if w := e.do("alice", "/withdrawals", dupKeys[0], `{"amount":"5"}`); w.Code != 429 || code(t, w) != "duplicate_submission" {
		t.Errorf("a 429's key and body again = %d %q; want 429 duplicate_submission", w.Code, code(t, w))
	}
	if w := e.do("alice", "/withdrawals", dupKeys[1], `{"amount":"6"}`); w.Code != 201 {
		t.Errorf("a 429's key with another body = %d %q; want 201", w.Code, code(t, w))
	}
}

// Pitfall 18 on the repeat-submit window: a request whose handler answered
// 5xx, or panicked, frees its window entry (docs/api.md: "A 5xx outcome
// frees the entry"), so the same body under a new key inside the window
// runs instead of answering 429 duplicate_submission. An accepted request
// holds the entry.
func TestRepeatWindowFreedOnFailure(t *testing.T) {
	for _, how := range []string{"5xx", "panic"} {
		t.Run(how, func(t *testing.T) {
			var cfg idempotency.Config
			e := newEnv(t, func(c *idempotency.Config) {
				c.Windows, c.Window = c.Store.(idemstore.WindowStore), 10*time.Second
				cfg = *c
			})
			var failNext atomic.Bool
			failNext.Store(true)
			e.handler = idempotency.Middleware(cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if failNext.Swap(false) {
					if how == "panic" {
						e.bank.runs.Add(1)
						panic("handler failed")
					}
					e.bank.status = http.StatusInternalServerError
					defer func() { e.bank.status = 0 }()
				}
				e.bank.ServeHTTP(w, r)
			}))
			func() {
				defer func() {
					if v := recover(); (v != nil) != (how == "panic") {
						t.Fatalf("first request panicked with %v; want a panic only from the panicking handler", v)
					}
				}()
				if w := e.do("alice", "/withdrawals", "first", `{"amount":"5"}`); how == "5xx" && w.Code != http.StatusInternalServerError {
					t.Fatalf("first = %d %s; want the handler's 500", w.Code, w.Body)
				}
			}()
			if w := e.do("alice", "/withdrawals", "second", `{"amount":"5"}`); w.Code != http.StatusCreated {
				t.Errorf("same body, new key, inside the window after a %s = %d %q; want 201 (the failure freed the window entry)", how, w.Code, code(t, w))
			}
			if w := e.do("alice", "/withdrawals", "third", `{"amount":"5"}`); w.Code != http.StatusTooManyRequests || code(t, w) != "duplicate_submission" {
				t.Errorf("same body, another key, after the accepted one = %d %q; want 429 duplicate_submission", w.Code, code(t, w))
			}
			if runs := e.bank.runs.Load(); runs != 2 || e.count("released") != 1 || e.count("duplicate_submission") != 1 {
				t.Errorf("runs %d, released %d, duplicate_submission %d; want 2, 1, 1", runs, e.count("released"), e.count("duplicate_submission"))
			}
		})
	}
}

func TestSubmitTokens(t *testing.T) {
	e := newEnv(t, func(c *idempotency.Config) { c.RequireToken = true })
	ctx := context.Background()
	if w := e.do("alice", "/withdrawals", "plain-key", `{"amount":"1"}`); w.Code != 400 || code(t, w) != "submit_token_required" {
		t.Errorf("plain key = %d %q; want 400 submit_token_required", w.Code, code(t, w))
	}
	is, _ := e.tokens.Issue(ctx, "alice", "withdrawal")
	if w := e.do("bob", "/withdrawals", is.Token, `{"amount":"1"}`); w.Code != 400 || code(t, w) != "submit_token_invalid" {
		t.Errorf("bob with alice's token = %d %q; want 400 submit_token_invalid", w.Code, code(t, w))
	}
	other, _ := e.tokens.Issue(ctx, "alice", "deposit")
	if w := e.do("alice", "/withdrawals", other.Token, `{"amount":"1"}`); code(t, w) != "submit_token_invalid" {
		t.Errorf("a deposit token on withdrawals = %q; want submit_token_invalid", code(t, w))
	}
	if w := e.do("alice", "/withdrawals", "st_forged", `{"amount":"1"}`); code(t, w) != "submit_token_invalid" {
		t.Errorf("unknown token = %q; want submit_token_invalid", code(t, w))
	}
	if e.count("token_foreign") != 1 || e.count("token_invalid") != 2 {
		t.Errorf("events token_foreign %d, token_invalid %d; want 1 (bob) and 2 (purpose, forged)", e.count("token_foreign"), e.count("token_invalid"))
	}
	// Bob's attempt did not burn it.
	first := e.do("alice", "/withdrawals", is.Token, `{"amount":"1"}`)
	if first.Code != 201 {
		t.Fatalf("alice's token = %d %s; want 201", first.Code, first.Body)
	}
	if w := e.do("alice", "/withdrawals", is.Token, `{"amount":"1"}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("token reused in its scope = %d; want a replay", w.Code)
	}
	if w := e.do("alice", "/other", is.Token, `{"amount":"1"}`); code(t, w) != "submit_token_invalid" {
		t.Errorf("token reused elsewhere = %q; want submit_token_invalid", code(t, w))
	}
}

func TestServerErrorFreesKeyAndToken(t *testing.T) {
	e := newEnv(t, nil)
	is, _ := e.tokens.Issue(context.Background(), "alice", "withdrawal")
	e.bank.status = http.StatusInternalServerError
	if w := e.do("alice", "/withdrawals", is.Token, `{"amount":"1"}`); w.Code != 500 {
		t.Fatalf("= %d; want the handler's 500", w.Code)
	}
	e.bank.status = 0
	if w := e.do("alice", "/withdrawals", is.Token, `{"amount":"1"}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after a 5xx = %d replayed=%q; want a fresh 201", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if e.bank.runs.Load() != 2 || e.count("released") != 1 {
		t.Errorf("runs %d, released %d; want 2, 1", e.bank.runs.Load(), e.count("released"))
	}
	// The token is freed, not left bound to the failed request's scope:
	// it serves another request (bound, a use elsewhere is invalid).
	is2, _ := e.tokens.Issue(context.Background(), "alice", "withdrawal")
	e.bank.status = http.StatusInternalServerError
	if w := e.do("alice", "/withdrawals", is2.Token, `{"amount":"2"}`); w.Code != 500 {
		t.Fatalf("= %d; want the handler's 500", w.Code)
	}
	e.bank.status = 0
	if w := e.do("alice", "/withdrawals/elsewhere", is2.Token, `{"amount":"2"}`); w.Code != 201 {
		t.Errorf("the token of a 5xx, used for another request = %d %q; want 201 (the 5xx freed it)", w.Code, code(t, w))
	}
	// A business refusal (4xx) is stored like a success.
	e.bank.status = http.StatusUnprocessableEntity
	w1 := e.do("alice", "/withdrawals", "refused", `{"amount":"1"}`)
	e.bank.status = 0
	if w2 := e.do("alice", "/withdrawals", "refused", `{"amount":"1"}`); w2.Code != 422 || w2.Body.String() != w1.Body.String() {
		t.Errorf("replay of a 422 = %d; want the stored 422", w2.Code)
	}
}

// A handler process that died in flight leaves a record with a lease; after
// the lease a retry runs again, and the unique constraint on the business
// write keeps the effect single.
func TestCrashedHolderRecovered(t *testing.T) {
	now := time.Now()
	e := newEnv(t, func(c *idempotency.Config) {
		c.Lease = 30 * time.Second
		c.Now = func() time.Time { return now }
	})
	scope := idempotency.Scope{Principal: "alice", Method: http.MethodPost, Path: "/withdrawals"}
	fp, _ := idempotency.Fingerprint([]byte(`{"amount":"1"}`))
	// The crashed process: it began, applied its effect, and never completed.
	res, err := e.store.Begin(context.Background(), idemstore.BeginRequest{
		ID: idempotency.RecordID(scope, "crash"), Fingerprint: fp, Lease: 30 * time.Second, TTL: time.Hour, Now: now,
	})
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	e.bank.effects = map[string]int{"alice\x00crash": 1}

	if w := e.do("alice", "/withdrawals", "crash", `{"amount":"1"}`); w.Code != 409 {
		t.Errorf("retry within the lease = %d; want 409", w.Code)
	}
	now = now.Add(31 * time.Second)
	w := e.do("alice", "/withdrawals", "crash", `{"amount":"1"}`)
	if w.Code != 201 || !strings.Contains(w.Body.String(), `"duplicate":true`) {
		t.Errorf("retry after the lease = %d %s; want 201 from a re-run that found the effect already applied", w.Code, w.Body)
	}
	if e.count("recovered") != 1 || e.bank.effects["alice\x00crash"] != 1 {
		t.Errorf("recovered %d, effects %d; want 1, 1", e.count("recovered"), e.bank.effects["alice\x00crash"])
	}
	if err := e.store.Complete(context.Background(), idempotency.RecordID(scope, "crash"), res.Lease, idemstore.Response{Status: 201}, now); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("the crashed holder's late Complete = %v; want ErrLeaseLost", err)
	}
}

// failing is a store that cannot be reached.
type failing struct{ idemstore.FullStore }

func (failing) Begin(context.Context, idemstore.BeginRequest) (idemstore.BeginResult, error) {
	return idemstore.BeginResult{}, fmt.Errorf("dial: %w", idempotency.ErrUnavailable)
}

func TestStoreUnavailable(t *testing.T) {
	b := &bank{}
	h := idempotency.Middleware(idempotency.Config{Store: failing{}})(b)
	r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 503 || code(t, w) != "store_unavailable" || w.Header().Get("Retry-After") == "" || b.runs.Load() != 0 {
		t.Errorf("= %d %q Retry-After=%q runs=%d; want 503 store_unavailable with Retry-After and no run", w.Code, code(t, w), w.Header().Get("Retry-After"), b.runs.Load())
	}
}

// gone is a store that gives up with the caller's context, as database
// drivers and Redis clients do when the client of an HTTP request hangs up.
type gone struct{ idemstore.FullStore }

func (gone) Begin(ctx context.Context, _ idemstore.BeginRequest) (idemstore.BeginResult, error) {
	<-ctx.Done()
	return idemstore.BeginResult{}, fmt.Errorf("query: %w", ctx.Err())
}

// A request whose client went away while the store worked is not a store
// outage: 503 request_interrupted and the event "interrupted", not
// store_unavailable (which operators alert on). A store error while the
// request is alive stays store_unavailable (TestStoreUnavailable).
func TestClientGoneIsNotStoreUnavailable(t *testing.T) {
	b := &bank{}
	var events []string
	h := idempotency.Middleware(idempotency.Config{Store: gone{}, OnEvent: func(_ *http.Request, ev string) { events = append(events, ev) }})(b)
	r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	ctx, cancel := context.WithCancel(r.Context())
	cancel()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r.WithContext(ctx))
	if w.Code != 503 || code(t, w) != "request_interrupted" || b.runs.Load() != 0 || !slices.Equal(events, []string{"interrupted"}) {
		t.Errorf("= %d %q runs=%d events %q; want 503 request_interrupted, no run, one event \"interrupted\"", w.Code, code(t, w), b.runs.Load(), events)
	}
}

func TestHandlerPanicFreesKey(t *testing.T) {
	store := &memstore.Store{}
	panics := true
	h := idempotency.Middleware(idempotency.Config{Store: store})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if panics {
			panic("boom")
		}
		w.WriteHeader(201)
	}))
	send := func() (code int, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		r := httptest.NewRequest(http.MethodPost, "/x", bytes.NewReader(nil))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, false
	}
	if _, p := send(); !p {
		t.Fatal("panic not propagated")
	}
	panics = false
	if c, _ := send(); c != 201 {
		t.Errorf("retry after a panic = %d; want 201 (the key was freed)", c)
	}
}

func TestReadBodyPassedOn(t *testing.T) {
	store := &memstore.Store{}
	var got string
	h := idempotency.Middleware(idempotency.Config{Store: store})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
	}))
	r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{"a":1}`))
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if got != `{"a":1}` {
		t.Errorf("handler read %q; want the body", got)
	}
}

// pausedFirst serves a middleware on memstore whose handler holds its
// first attempt until resume and then answers it staleCode (0: nothing, as
// a process that died); later attempts answer 201. advance moves its clock.
type pausedFirst struct {
	h       http.Handler
	mu      sync.Mutex
	now     time.Time
	first   bool
	entered chan struct{}
	stuck   chan struct{}
}

func newPausedFirst(staleCode int) *pausedFirst {
	p := &pausedFirst{now: time.Now(), first: true, entered: make(chan struct{}, 1), stuck: make(chan struct{})}
	store := &memstore.Store{}
	p.h = idempotency.Middleware(idempotency.Config{
		Store: store, Windows: store, Window: time.Minute, Lease: 30 * time.Second,
		Now:       func() time.Time { p.mu.Lock(); defer p.mu.Unlock(); return p.now },
		Principal: func(r *http.Request) (string, error) { return "alice", nil },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		f := p.first
		p.first = false
		p.mu.Unlock()
		if f {
			p.entered <- struct{}{}
			<-p.stuck
			if staleCode != 0 {
				w.WriteHeader(staleCode)
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	return p
}

func (p *pausedFirst) send(key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"1"}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	p.h.ServeHTTP(w, r)
	return w
}

func (p *pausedFirst) advance(d time.Duration) { p.mu.Lock(); p.now = p.now.Add(d); p.mu.Unlock() }

// A retry of a crashed request's key is not a duplicate of itself: the
// window entry its first attempt left belongs to the key.
func TestRecoveredKeyPassesItsOwnWindow(t *testing.T) {
	p := newPausedFirst(0) // the first attempt's process "dies": it never answers
	done := make(chan struct{})
	go func() { defer close(done); p.send("k") }()
	<-p.entered // it passed the window and runs
	if w := p.send("k"); w.Code != 409 {
		t.Errorf("retry within the lease = %d; want 409", w.Code)
	}
	p.advance(31 * time.Second)
	if w := p.send("k"); w.Code != 201 {
		t.Errorf("retry after the lease = %d %s; want 201 (not 429 from its own window entry)", w.Code, w.Body)
	}
	close(p.stuck)
	<-done
}

// A stale attempt that fails after its key was taken over frees only its
// own window claim: the successor's entry still turns a duplicate away.
func TestStaleAttemptKeepsSuccessorsWindow(t *testing.T) {
	p := newPausedFirst(http.StatusServiceUnavailable) // paused past its lease, then it fails
	done := make(chan int)
	go func() { done <- p.send("k").Code }()
	<-p.entered
	p.advance(31 * time.Second)
	if w := p.send("k"); w.Code != 201 {
		t.Fatalf("retry after the lease = %d %s; want 201", w.Code, w.Body)
	}
	close(p.stuck)
	if code := <-done; code != 503 {
		t.Fatalf("stale attempt = %d; want its 503", code)
	}
	if w := p.send("k2"); w.Code != 429 {
		t.Errorf("same body under a new key after the stale attempt failed = %d %s; want 429 (the retry's window entry)", w.Code, w.Body)
	}
}

// An answer the handler marks transient (Forget) is sent, not stored: the
// same key runs again.
func TestForget(t *testing.T) {
	store := &memstore.Store{}
	runs := 0
	h := idempotency.Middleware(idempotency.Config{Store: store})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if runs == 1 {
			call, _ := idempotency.FromContext(r.Context())
			call.Forget()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func() int {
		r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if c := send(); c != 409 {
		t.Fatalf("first = %d; want the handler's 409", c)
	}
	if c := send(); c != 201 || runs != 2 {
		t.Errorf("retry = %d after %d runs; want a fresh run (201, 2 runs)", c, runs)
	}
	if c := send(); c != 201 || runs != 2 {
		t.Errorf("third = %d after %d runs; want the stored 201 replayed", c, runs)
	}
}

// A handler that gives up without answering when the request's context
// ends (its deadline, a client gone) has made no outcome: the key is
// freed (503 request_interrupted), not an empty 200 replayed for the
// key's whole TTL. The retry runs. A handler that answers nothing while
// its request is live is an empty 200, stored as usual.
func TestNoAnswerAfterContextEnds(t *testing.T) {
	var runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(ctx context.Context, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/jobs", strings.NewReader(`{}`)).WithContext(ctx)
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if w := send(ctx, "k"); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "request_interrupted") {
		t.Errorf("no answer after the deadline = %d %s; want 503 request_interrupted", w.Code, w.Body)
	}
	if w := send(context.Background(), "k"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("retry = %d (replayed %q); want the handler run again, 201", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	silent := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i, want := range []string{"", "true"} {
		r := httptest.NewRequest("POST", "/jobs", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "quiet")
		w := httptest.NewRecorder()
		silent.ServeHTTP(w, r)
		if w.Code != 200 || w.Header().Get("Idempotent-Replayed") != want {
			t.Errorf("silent handler, call %d = %d (replayed %q); want 200, replayed %q", i+1, w.Code, w.Header().Get("Idempotent-Replayed"), want)
		}
	}
}

// A Window without Windows uses the Store when it is a WindowStore, and
// is refused at construction when it is not: never silently off.
func TestWindowDefaultsToStore(t *testing.T) {
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Window: 10 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	var codes []int
	for _, key := range []string{"a", "b"} {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"amount":"1"}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if codes[0] != 201 || codes[1] != 429 {
		t.Errorf("same body under two keys = %v; want 201, 429 (the window on the store)", codes)
	}
	defer func() {
		if v := recover(); v == nil {
			t.Error("a Window with a Store that keeps no window: no panic")
		}
	}()
	idempotency.Middleware(idempotency.Config{Store: struct{ idemstore.Store }{&memstore.Store{}}, Window: time.Second})
}

// Every answer the middleware writes tells caches not to keep it: a
// cached first answer would be handed to a retry without reaching the
// server (and the record), a cached replay to another client. A
// handler's own Cache-Control on its first answer is kept; a replay
// always says no-store.
func TestCacheControlNoStore(t *testing.T) {
	for _, tc := range []struct {
		name, set, first string
	}{
		{"handler sets none", "", "no-store"},
		{"handler sets its own", "private, max-age=0", "private, max-age=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.set != "" {
					w.Header().Set("Cache-Control", tc.set)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"1"}`)
			}))
			send := func(key, body string) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
				if key != "" {
					r.Header.Set("Idempotency-Key", key)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			for _, c := range []struct {
				what, key, body string
				code            int
				want            string
			}{
				{"first answer", "k1", `{"a":1}`, http.StatusCreated, tc.first},
				{"replay", "k1", `{"a":1}`, http.StatusCreated, "no-store"},
				{"mismatch", "k1", `{"a":2}`, http.StatusUnprocessableEntity, "no-store"},
				{"missing key", "", `{"a":1}`, http.StatusBadRequest, "no-store"},
			} {
				w := send(c.key, c.body)
				if got := w.Header().Values("Cache-Control"); w.Code != c.code || len(got) != 1 || got[0] != c.want {
					t.Errorf("%s: %d, Cache-Control %q; want %d, [%q]", c.what, w.Code, got, c.code, c.want)
				}
			}
		})
	}
}

// overWindow is a window store that says more time is left than the window
// has, as a store did to a request started before the winner's.
type overWindow struct{ *memstore.Store }

func (overWindow) ClaimWindow(ctx context.Context, id, owner string, window time.Duration, now time.Time) (time.Duration, error) {
	return window + 500*time.Millisecond, nil
}

// Retry-After of a duplicate_submission is whole seconds left, never more
// than the window.
func TestDuplicateRetryAfterAtMostWindow(t *testing.T) {
	store := &memstore.Store{}
	h := idempotency.Middleware(idempotency.Config{
		Store: store, Windows: overWindow{store}, Window: 10 * time.Second,
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"1"}`))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 429 || w.Header().Get("Retry-After") != "10" {
		t.Errorf("duplicate = %d, Retry-After %q; want 429, 10 (the window)", w.Code, w.Header().Get("Retry-After"))
	}
}
