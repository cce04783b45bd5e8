// Package storetest is the conformance suite every idemstore.FullStore
// runs (records, the repeat-submit window, tokens, and idempotency.Once on
// the store):
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idemstore.FullStore { return newStore(t) })
//	}
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
	"github.com/onceguard/onceguard/token/tokentest"
)

// Run runs the suite; newStore is called once per subtest. Ids are unique
// per run, so stores may share a database.
func Run(t *testing.T, newStore func(t *testing.T) idemstore.FullStore) {
	ctx := context.Background()
	uniq := func(t *testing.T, s string) string {
		return idempotency.RecordID(idempotency.Scope{Principal: t.Name(), Path: fmt.Sprint(time.Now().UnixNano())}, s)
	}
	begin := func(t *testing.T, s idemstore.Store, id, fp string, now time.Time, claim *idemstore.TokenClaim) idemstore.BeginResult {
		t.Helper()
		res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: 30 * time.Second, TTL: time.Hour, Token: claim, Now: now})
		if err != nil {
			t.Fatalf("Begin = %v", err)
		}
		return res
	}

	t.Run("Lifecycle", func(t *testing.T) {
		s := newStore(t)
		id, now := uniq(t, "k"), time.Now()
		res := begin(t, s, id, "fp1", now, nil)
		if res.Outcome != idemstore.Started || res.Lease == "" {
			t.Fatalf("first Begin = %+v; want Started with a lease", res)
		}
		if got := begin(t, s, id, "fp1", now, nil); got.Outcome != idemstore.InProgress {
			t.Errorf("Begin while in flight = %v; want InProgress", got.Outcome)
		}
		if got := begin(t, s, id, "fp2", now, nil); got.Outcome != idemstore.Mismatch {
			t.Errorf("Begin with another fingerprint = %v; want Mismatch", got.Outcome)
		}
		if err := s.Complete(ctx, id, "not-the-lease", idemstore.Response{Status: 201}, now); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Complete with a wrong lease = %v; want ErrLeaseLost", err)
		}
		resp := idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"1"}` + "\x00\xff")}
		if err := s.Complete(ctx, id, res.Lease, resp, now); err != nil {
			t.Fatalf("Complete = %v", err)
		}
		got := begin(t, s, id, "fp1", now, nil)
		if got.Outcome != idemstore.Replay || got.Record == nil || got.Record.Response == nil {
			t.Fatalf("Begin after Complete = %+v; want Replay with the response", got)
		}
		r := got.Record.Response
		if r.Status != 201 || !bytes.Equal(r.Body, resp.Body) || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("replayed %d %q %v; want %d %q %v", r.Status, r.Body, r.Header, resp.Status, resp.Body, resp.Header)
		}
		// The record expires TTL after it was created: a client is told
		// how long its retries get this answer (Options.ExpiryHeader).
		if exp := got.Record.ExpiresAt; exp.Sub(now.Add(time.Hour)).Abs() > time.Millisecond {
			t.Errorf("replayed record expires at %v; want %v (created + TTL)", exp, now.Add(time.Hour))
		}
		if got := begin(t, s, id, "fp2", now, nil); got.Outcome != idemstore.Mismatch {
			t.Errorf("completed key with another fingerprint = %v; want Mismatch", got.Outcome)
		}
		if err := s.Complete(ctx, id, res.Lease, resp, now); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("second Complete = %v; want ErrLeaseLost", err)
		}
	})

	t.Run("AbandonAndExpiry", func(t *testing.T) {
		s := newStore(t)
		id, now := uniq(t, "k"), time.Now()
		res := begin(t, s, id, "fp", now, nil)
		if err := s.Abandon(ctx, id, res.Lease); err != nil {
			t.Fatalf("Abandon = %v", err)
		}
		res2 := begin(t, s, id, "other", now, nil)
		if res2.Outcome != idemstore.Started {
			t.Fatalf("Begin after Abandon = %v; want Started", res2.Outcome)
		}
		// The lease runs out (at its end exactly, on every store): the next
		// Begin takes over; the old holder can no longer complete.
		later := now.Add(30 * time.Second)
		res3 := begin(t, s, id, "other", later, nil)
		if res3.Outcome != idemstore.Started || !res3.Recovered || res3.Lease == res2.Lease {
			t.Fatalf("Begin after the lease = %+v; want Started, Recovered, a new lease", res3)
		}
		if err := s.Complete(ctx, id, res2.Lease, idemstore.Response{Status: 201}, later); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Complete by the old holder = %v; want ErrLeaseLost", err)
		}
		// Nor free it (PITFALLS 16, 17): a slow holder that ends in a 5xx
		// after its lease ran out must not delete the new holder's record,
		// or a third request would run beside the second.
		if err := s.Abandon(ctx, id, res2.Lease); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("Abandon by the old holder = %v; want ErrLeaseLost", err)
		}
		if got := begin(t, s, id, "other", later, nil); got.Outcome != idemstore.InProgress {
			t.Errorf("Begin after the old holder's Abandon = %v; want InProgress (the new holder's)", got.Outcome)
		}
		if err := s.Complete(ctx, id, res3.Lease, idemstore.Response{Status: 201}, later); err != nil {
			t.Fatalf("Complete by the new holder = %v", err)
		}
		// At its TTL the record is gone: the key starts afresh.
		if got := begin(t, s, id, "third", now.Add(time.Hour), nil); got.Outcome != idemstore.Started || got.Recovered {
			t.Errorf("Begin after the TTL = %+v; want a fresh Started", got)
		}
	})

	t.Run("BeginRace", func(t *testing.T) {
		s := newStore(t)
		id, now := uniq(t, "k"), time.Now()
		const n = 200
		var started, other atomic.Int32
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Now: now})
				switch {
				case err != nil:
					t.Errorf("Begin = %v", err)
				case res.Outcome == idemstore.Started:
					started.Add(1)
				default:
					other.Add(1)
				}
			}()
		}
		close(gate)
		wg.Wait()
		if started.Load() != 1 {
			t.Errorf("%d of %d concurrent Begins started; want exactly 1", started.Load(), n)
		}
	})

	t.Run("TokenBoundWithRecord", func(t *testing.T) {
		s := newStore(t)
		tk := token.New(s, nil)
		user := "u-" + uniq(t, "u")[:12]
		is, err := tk.Issue(ctx, user, "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		scope := uniq(t, "scope")
		foreign := &idemstore.TokenClaim{Hash: token.Hash(is.Token), Subject: "someone-else", Purpose: "withdrawal", Scope: scope}
		id := uniq(t, is.Token)
		if _, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: foreign, Now: now}); !errors.Is(err, token.ErrForeign) {
			t.Fatalf("Begin with a foreign token = %v; want ErrForeign", err)
		}
		claim := &idemstore.TokenClaim{Hash: token.Hash(is.Token), Subject: user, Purpose: "withdrawal", Scope: scope}
		// Unused at its expiry, it is refused (and, below, not burnt).
		if _, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim, Now: is.ExpiresAt}); !errors.Is(err, token.ErrExpired) {
			t.Errorf("Begin with the token at its expiry = %v; want ErrExpired", err)
		}
		res := begin(t, s, id, "fp", now, claim) // the refusals created no record
		if res.Outcome != idemstore.Started {
			t.Fatalf("Begin with the owner's token = %v; want Started", res.Outcome)
		}
		if err := tk.Check(ctx, is.Token, user, "withdrawal", "another-scope"); !errors.Is(err, token.ErrUsed) {
			t.Errorf("token after Begin, elsewhere = %v; want ErrUsed", err)
		}
		if err := s.Abandon(ctx, id, res.Lease); err != nil {
			t.Fatal(err)
		}
		if err := tk.Check(ctx, is.Token, user, "withdrawal", "another-scope"); err != nil {
			t.Errorf("token after Abandon = %v; want usable again", err)
		}
		// Long past its expiry (a store may have dropped it by then).
		late, err := tk.Issue(ctx, user, "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		lateClaim := &idemstore.TokenClaim{Hash: token.Hash(late.Token), Subject: user, Purpose: "withdrawal", Scope: scope}
		if _, err := s.Begin(ctx, idemstore.BeginRequest{ID: uniq(t, late.Token), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: lateClaim, Now: late.ExpiresAt.Add(time.Hour)}); !errors.Is(err, token.ErrInvalid) {
			t.Errorf("Begin with a token an hour past its expiry = %v; want a refusal (ErrInvalid)", err)
		}
	})

	t.Run("SignedTokens", func(t *testing.T) { signedTokens(t, newStore(t), uniq) })

	// Pitfall 21: one submit token sent at once as the key of two
	// different requests (two scopes, two records). Binding it and creating
	// the record are one atomic step: exactly one Begin starts, the other
	// is refused with ErrUsed and leaves no record behind; the refusal
	// burns nothing; abandoning the winner makes the token usable again.
	t.Run("TokenBindRace", func(t *testing.T) {
		s := newStore(t)
		tk := token.New(s, nil)
		user := "u-" + uniq(t, "u")[:12]
		const rounds = 20
		for round := range rounds {
			is, err := tk.Issue(ctx, user, "withdrawal")
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			scopes := [2]string{uniq(t, fmt.Sprint("scope-a-", round)), uniq(t, fmt.Sprint("scope-b-", round))}
			ids := [2]string{uniq(t, "a-"+is.Token), uniq(t, "b-"+is.Token)}
			claim := func(tok string, i int) *idemstore.TokenClaim {
				return &idemstore.TokenClaim{Hash: token.Hash(tok), Subject: user, Purpose: "withdrawal", Scope: scopes[i]}
			}
			var (
				results [2]idemstore.BeginResult
				errs    [2]error
				wg      sync.WaitGroup
				ready   sync.WaitGroup
			)
			gate := make(chan struct{})
			ready.Add(2)
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ready.Done()
					<-gate
					results[i], errs[i] = s.Begin(ctx, idemstore.BeginRequest{ID: ids[i], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim(is.Token, i), Now: now})
				}()
			}
			ready.Wait() // both at the barrier
			close(gate)
			wg.Wait()

			winner := -1
			for i := range 2 {
				if errs[i] == nil && results[i].Outcome == idemstore.Started && results[i].Lease != "" {
					if winner >= 0 {
						t.Fatalf("round %d: one token, two scopes: both Begins started (%+v, %+v); want exactly one", round, results[0], results[1])
					}
					winner = i
				}
			}
			if winner < 0 {
				t.Fatalf("round %d: neither Begin started: %+v %v, %+v %v; want exactly one Started", round, results[0], errs[0], results[1], errs[1])
			}
			loser := 1 - winner
			if err := errs[loser]; !errors.Is(err, token.ErrUsed) || !errors.Is(err, token.ErrInvalid) {
				t.Fatalf("round %d: the losing Begin = %+v, %v; want token.ErrUsed (matching token.ErrInvalid)", round, results[loser], err)
			}
			// The token is bound to the winner's scope, not the loser's.
			if err := tk.Check(ctx, is.Token, user, "withdrawal", scopes[winner]); err != nil {
				t.Errorf("round %d: token in the winner's scope = %v; want usable (bound there)", round, err)
			}
			if err := tk.Check(ctx, is.Token, user, "withdrawal", scopes[loser]); !errors.Is(err, token.ErrUsed) {
				t.Errorf("round %d: token in the loser's scope = %v; want ErrUsed", round, err)
			}
			// The refusal created no record: the loser's id, with a fresh
			// token of its scope, starts afresh (a stray in-flight record
			// would answer InProgress, or Recovered after its lease).
			fresh, err := tk.Issue(ctx, user, "withdrawal")
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Begin(ctx, idemstore.BeginRequest{ID: ids[loser], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim(fresh.Token, loser), Now: now})
			if err != nil || res.Outcome != idemstore.Started || res.Recovered {
				t.Fatalf("round %d: Begin of the loser's id with a fresh token = %+v, %v; want a fresh Started (no stray record)", round, res, err)
			}
			if err := s.Abandon(ctx, ids[loser], res.Lease); err != nil {
				t.Fatalf("round %d: Abandon of the fresh token's record = %v", round, err)
			}
			// The winner gives up (a 5xx): the token is usable again, and
			// the loser's request can now take it.
			if err := s.Abandon(ctx, ids[winner], results[winner].Lease); err != nil {
				t.Fatalf("round %d: Abandon of the winner = %v", round, err)
			}
			if err := tk.Check(ctx, is.Token, user, "withdrawal", scopes[loser]); err != nil {
				t.Errorf("round %d: token after the winner's Abandon = %v; want usable again", round, err)
			}
			res, err = s.Begin(ctx, idemstore.BeginRequest{ID: ids[loser], Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: claim(is.Token, loser), Now: now})
			if err != nil || res.Outcome != idemstore.Started || res.Recovered {
				t.Fatalf("round %d: the token in the loser's scope after the winner's Abandon = %+v, %v; want a fresh Started", round, res, err)
			}
			if err := tk.Check(ctx, is.Token, user, "withdrawal", scopes[winner]); !errors.Is(err, token.ErrUsed) {
				t.Errorf("round %d: token in the old winner's scope after rebinding = %v; want ErrUsed", round, err)
			}
			if err := s.Complete(ctx, ids[loser], res.Lease, idemstore.Response{Status: 201}, now); err != nil {
				t.Fatalf("round %d: Complete = %v", round, err)
			}
		}
	})

	t.Run("WindowFreedAfterFailure", func(t *testing.T) { windowFreed(t, newStore(t)) })

	t.Run("Window", func(t *testing.T) {
		s := newStore(t)
		id, now := uniq(t, "w"), time.Now()
		if left, err := s.ClaimWindow(ctx, id, "a", 10*time.Second, now); err != nil || left != 0 {
			t.Fatalf("first ClaimWindow = %v, %v; want 0, nil", left, err)
		}
		if left, err := s.ClaimWindow(ctx, id, "a", 10*time.Second, now.Add(time.Second)); err != nil || left != 0 {
			t.Errorf("ClaimWindow by its owner again = %v, %v; want 0 (a retry of the same request)", left, err)
		}
		left, err := s.ClaimWindow(ctx, id, "b", 10*time.Second, now.Add(3*time.Second))
		if err != nil || left <= 6*time.Second || left > 7*time.Second {
			t.Errorf("ClaimWindow inside the window = %v, %v; want about 7s left", left, err)
		}
		_ = s.FreeWindow(ctx, id, "b") // not the owner: no effect
		if left, _ := s.ClaimWindow(ctx, id, "b", 10*time.Second, now.Add(4*time.Second)); left == 0 {
			t.Error("FreeWindow by a non-owner freed the entry")
		}
		if err := s.FreeWindow(ctx, id, "a"); err != nil {
			t.Fatal(err)
		}
		if left, _ := s.ClaimWindow(ctx, id, "c", 10*time.Second, now.Add(5*time.Second)); left != 0 {
			t.Errorf("ClaimWindow after FreeWindow = %v; want 0", left)
		}
		// c's entry ends at now+15s exactly, on every store.
		if left, _ := s.ClaimWindow(ctx, id, "x", 10*time.Second, now.Add(15*time.Second-time.Millisecond)); left <= 0 {
			t.Errorf("ClaimWindow 1ms before the window ends = %v; want > 0", left)
		}
		if left, _ := s.ClaimWindow(ctx, id, "d", 10*time.Second, now.Add(15*time.Second)); left != 0 {
			t.Errorf("ClaimWindow at the window's end = %v; want 0", left)
		}
		// Of many at once, one wins.
		id2 := uniq(t, "w2")
		var won atomic.Int32
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if left, err := s.ClaimWindow(ctx, id2, fmt.Sprint(i), 10*time.Second, now); err == nil && left == 0 {
					won.Add(1)
				}
			}()
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Errorf("%d of 50 concurrent ClaimWindow won; want 1", won.Load())
		}
	})

	t.Run("WindowLeftBounded", func(t *testing.T) {
		// Requests of a storm start before and after the winner's: each
		// loser is told 0 < left <= window, whatever its own start time.
		s := newStore(t)
		id, base := uniq(t, "wl"), time.Now()
		const window = 10 * time.Second
		if left, err := s.ClaimWindow(ctx, id, "winner", window, base.Add(500*time.Millisecond)); err != nil || left != 0 {
			t.Fatalf("first ClaimWindow = %v, %v; want 0, nil", left, err)
		}
		lefts := make([]time.Duration, 50)
		errs := make([]error, 50)
		var wg sync.WaitGroup
		for i := range lefts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lefts[i], errs[i] = s.ClaimWindow(ctx, id, fmt.Sprint("loser", i), window, base.Add(time.Duration(i)*20*time.Millisecond))
			}()
		}
		wg.Wait()
		for i, left := range lefts {
			if errs[i] != nil || left <= 0 || left > window {
				t.Errorf("loser %d (started %v from the winner) = %v, %v; want 0 < left <= %v", i, time.Duration(i)*20*time.Millisecond-500*time.Millisecond, left, errs[i], window)
			}
		}
	})

	t.Run("WindowFreeOnlyOwnClaim", func(t *testing.T) {
		// A retry that took the key over claims the entry; the stale
		// attempt's free must leave it in place.
		s := newStore(t)
		id, now := uniq(t, "wo"), time.Now()
		stale, retry := idemstore.WindowOwner("rec", "lease1"), idemstore.WindowOwner("rec", "lease2")
		if left, err := s.ClaimWindow(ctx, id, stale, 10*time.Second, now); err != nil || left != 0 {
			t.Fatalf("first ClaimWindow = %v, %v; want 0, nil", left, err)
		}
		if left, err := s.ClaimWindow(ctx, id, retry, 10*time.Second, now.Add(time.Second)); err != nil || left != 0 {
			t.Fatalf("ClaimWindow by a new attempt at the same record = %v, %v; want 0 (not a duplicate of itself)", left, err)
		}
		if err := s.FreeWindow(ctx, id, stale); err != nil {
			t.Fatal(err)
		}
		left, err := s.ClaimWindow(ctx, id, idemstore.WindowOwner("other", "lease3"), 10*time.Second, now.Add(2*time.Second))
		if err != nil || left <= 7*time.Second || left > 8*time.Second {
			t.Errorf("ClaimWindow of another record after the stale attempt's free = %v, %v; want about 8s left (the retry's entry, first expiry kept)", left, err)
		}
		if err := s.FreeWindow(ctx, id, retry); err != nil {
			t.Fatal(err)
		}
		if left, _ := s.ClaimWindow(ctx, id, idemstore.WindowOwner("other", "lease3"), 10*time.Second, now.Add(3*time.Second)); left != 0 {
			t.Errorf("ClaimWindow after the owner's free = %v; want 0", left)
		}
	})

	t.Run("MiddlewareStorms", func(t *testing.T) { storms(t, newStore(t)) })

	t.Run("Notifier", func(t *testing.T) {
		s := newStore(t)
		n, ok := s.(idemstore.Notifier)
		if !ok {
			t.Skip("not an idemstore.Notifier: a waiting retry polls it")
		}
		for _, end := range []string{"Complete", "Abandon"} {
			id, now := uniq(t, end), time.Now()
			res := begin(t, s, id, "fp", now, nil)
			ch, stop, err := n.Watch(ctx, id)
			if err != nil {
				// A store that notifies only when configured to (sqlstore
				// with a Listener) says so; a waiting retry polls it.
				t.Skipf("Watch = %v: a waiting retry polls this store", err)
			}
			if end == "Complete" {
				err = s.Complete(ctx, id, res.Lease, idemstore.Response{Status: 200}, now)
			} else {
				err = s.Abandon(ctx, id, res.Lease)
			}
			if err != nil {
				t.Fatalf("%s = %v", end, err)
			}
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Errorf("Watch was not woken by %s within 10s", end)
			}
			stop()
			stop() // twice is harmless
		}
	})

	t.Run("Once", func(t *testing.T) { once(t, newStore) })

	t.Run("Tokens", func(t *testing.T) {
		tokentest.Run(t, func(t *testing.T) token.Store { return newStore(t) })
	})
}

// storms checks the middleware's race guarantees on the store: 200
// identical requests with one key run the handler once; 50 requests with
// different keys and one body inside the repeat window are accepted once.
func storms(t *testing.T, s idemstore.FullStore) {
	var runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{
		Store: s, Windows: s, Window: time.Minute,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
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
}

// windowFreed checks pitfall 18 on the store's window: a request whose
// handler answers 5xx, or panics, frees its repeat-window entry, so the
// same body under a new key inside the window runs (not 429); an accepted
// one holds it.
func windowFreed(t *testing.T, s idemstore.FullStore) {
	const (
		ok = iota
		fail
		panics
	)
	var mode, runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{
		Store: s, Windows: s, Window: time.Minute,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		switch mode.Load() {
		case fail:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"code":"internal"}`))
		case panics:
			panic("handler failed")
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"ok":true}`))
		}
	}))
	send := func(user, key string) (code int, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"5"}`))
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("X-User", user)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, false
	}
	for _, how := range []struct {
		name string
		mode int32
	}{{"5xx", fail}, {"panic", panics}} {
		user := fmt.Sprintf("u%d-%s", time.Now().UnixNano(), how.name)
		runs.Store(0)
		mode.Store(how.mode)
		code, panicked := send(user, "first")
		if how.mode == fail && (code != http.StatusInternalServerError || panicked) {
			t.Fatalf("%s: first = %d (panicked %v); want the handler's 500", how.name, code, panicked)
		}
		if how.mode == panics && !panicked {
			t.Fatalf("%s: first = %d; want the handler's panic propagated", how.name, code)
		}
		mode.Store(ok)
		if code, _ := send(user, "second"); code != http.StatusCreated {
			t.Errorf("%s: same body, new key, inside the window after a failed first = %d; want 201 (the failure freed its window entry)", how.name, code)
		}
		// The window is on: the accepted second holds it.
		if code, _ := send(user, "third"); code != http.StatusTooManyRequests {
			t.Errorf("%s: same body, another key, after an accepted request = %d; want 429", how.name, code)
		}
		if n := runs.Load(); n != 2 {
			t.Errorf("%s: handler ran %d times; want 2 (the failed first and the second)", how.name, n)
		}
	}
}

// signedTokens: a store that binds signed tokens (idemstore.SignedTokenStore)
// binds one, which has no record of its own, to the scope of the first
// record it creates: a retry there is that record's answer, another scope
// is refused token.ErrUsed and leaves no record; Abandon frees it; past
// its time (Expired) it answers the record it created and creates none;
// of concurrent first uses in ten scopes, one starts.
func signedTokens(t *testing.T, st idemstore.FullStore, uniq func(*testing.T, string) string) {
	s, ok := st.(idemstore.SignedTokenStore)
	if !ok {
		t.Skip("not an idemstore.SignedTokenStore")
	}
	ctx := context.Background()
	now := time.Now()
	hash := token.Hash(uniq(t, "st_signed"))
	claim := func(scope string) *idemstore.TokenClaim {
		return &idemstore.TokenClaim{Hash: hash, Subject: "alice", Purpose: "pay", Scope: scope, Signed: true}
	}
	begin := func(id, scope string, c *idemstore.TokenClaim) (idemstore.BeginResult, error) {
		if c == nil {
			c = claim(scope)
		}
		return s.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Token: c, Now: now})
	}
	a, b := uniq(t, "scope-a"), uniq(t, "scope-b")
	idA, idB := uniq(t, "rec-a"), uniq(t, "rec-b")

	res, err := begin(idA, a, nil)
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("first use = %+v, %v; want Started", res, err)
	}
	if _, err := begin(idB, b, nil); !errors.Is(err, token.ErrUsed) {
		t.Fatalf("the token in another scope while in flight = %v; want ErrUsed", err)
	}
	if err := s.Abandon(ctx, idA, res.Lease); err != nil {
		t.Fatal(err)
	}
	// Freed: the other scope may have it now; then the first cannot.
	res, err = begin(idB, b, nil)
	if err != nil || res.Outcome != idemstore.Started {
		t.Fatalf("after Abandon, another scope = %+v, %v; want Started", res, err)
	}
	if err := s.Complete(ctx, idB, res.Lease, idemstore.Response{Status: 201, Body: []byte("b")}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := begin(idA, a, nil); !errors.Is(err, token.ErrUsed) {
		t.Fatalf("the first scope, after the other completed = %v; want ErrUsed", err)
	}
	if got, err := begin(idB, b, nil); err != nil || got.Outcome != idemstore.Replay || string(got.Record.Response.Body) != "b" {
		t.Fatalf("its own retry = %+v, %v; want the replay", got, err)
	}
	// Past its time: its own record still answers; nothing new is made.
	expired := claim(b)
	expired.Expired = true
	if got, err := begin(idB, b, expired); err != nil || got.Outcome != idemstore.Replay {
		t.Fatalf("its retry past the token's time = %+v, %v; want the replay", got, err)
	}
	other := claim(b)
	other.Hash, other.Expired = token.Hash(uniq(t, "st_late")), true
	if _, err := begin(uniq(t, "rec-late"), b, other); !errors.Is(err, token.ErrExpired) {
		t.Fatalf("an unused token past its time = %v; want ErrExpired", err)
	}
	// It created nothing: within its time it starts.
	other.Expired = false
	lateID := uniq(t, "rec-late2")
	if got, err := begin(lateID, b, other); err != nil || got.Outcome != idemstore.Started {
		t.Fatalf("that token within its time = %+v, %v; want Started (the refusal bound nothing)", got, err)
	}

	// Ten first uses of one token in ten scopes at once: one starts.
	hash = token.Hash(uniq(t, "st_race"))
	var started atomic.Int32
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			scope := uniq(t, fmt.Sprint("race-", i))
			res, err := begin(uniq(t, fmt.Sprint("race-rec-", i)), scope, nil)
			switch {
			case err == nil && res.Outcome == idemstore.Started:
				started.Add(1)
			case !errors.Is(err, token.ErrUsed):
				t.Errorf("a racing first use = %+v, %v; want Started or ErrUsed", res, err)
			}
		}()
	}
	wg.Wait()
	if n := started.Load(); n != 1 {
		t.Errorf("%d of 10 racing first uses started; want 1", n)
	}
}
