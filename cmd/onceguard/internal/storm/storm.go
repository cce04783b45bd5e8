// Package storm fires duplicate storms at a running onceguard service
// and checks that money moved exactly once (`onceguard storm`).
package storm

import (
	"context"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// Config is what a storm is told.
type Config struct {
	Target  string        // the service's base URL, without a trailing slash
	N       int           // concurrent requests in each scenario, 2..MaxN
	Amount  money.Amount  // the withdrawals of (a); (b) uses it + 0.01, (c)'s order it + 0.02
	Timeout time.Duration // bound on the whole storm
	JSON    bool          // print one JSON document instead of the table
}

// MaxN bounds Config.N: every scenario opens N connections at once.
const MaxN = 5000

// Run fires a duplicate storm at a running service as a fresh user: a
// deposit large enough to pay every request of the storm, then three
// scenarios of N concurrent requests, each of which must move money
// exactly once:
//
//	(a) N withdrawals with one submit token: one debit, the rest replays
//	    or 409 request_in_progress;
//	(b) N withdrawals with N submit tokens and one body: one accepted, the
//	    rest 429 duplicate_submission (the repeat window);
//	(c) N payments of one order with N keys: paid once.
//
// It prints a summary table (or, with JSON, one JSON document) to stdout
// and a progress bar to stderr when stderr is a terminal (getenv reads
// TERM). It returns an error when a scenario fails or the target cannot be
// reached.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer, getenv func(string) string) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = c.N+16, c.N+16 // keep the storm's connections for the next scenario
	defer tr.CloseIdleConnections()
	s := &stormer{cfg: c, hc: &http.Client{Transport: tr}, progress: newStormProgress(stderr, getenv)}

	rep, err := s.run(ctx)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("storm: gave up after --timeout %v: %w", c.Timeout, err)
		}
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.writeTable(stdout)
	}
	var failed []string
	for _, sc := range rep.Scenarios {
		if !sc.Pass {
			failed = append(failed, "("+sc.Name+")")
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("storm: FAIL: money did not move exactly once in %s", strings.Join(failed, ", "))
	}
	if !rep.Pass {
		return errors.New("storm: FAIL: the balance or the ledger is not what the scenarios should have left")
	}
	return nil
}

// stormer runs the storm as one user.
type stormer struct {
	cfg      Config
	hc       *http.Client
	token    string // the user's session
	progress *stormProgress
}

func (s *stormer) run(ctx context.Context) (*stormReport, error) {
	began := time.Now()
	a, b, c := s.cfg.Amount, s.cfg.Amount+1, s.cfg.Amount+2
	n := money.Amount(s.cfg.N)
	// Enough to pay every request of every scenario: if the guard let a
	// duplicate through, the balance would not stop it and the storm would
	// see it.
	deposit := n * (a + b + c)
	if deposit/n != a+b+c || deposit > 1_000_000_00 {
		return nil, fmt.Errorf("storm: --n %d × --amount %s needs a deposit of over 1000000.00, the service's default --max-amount; lower --n or --amount", s.cfg.N, s.cfg.Amount)
	}
	rep := &stormReport{Target: s.cfg.Target, N: s.cfg.N, Amount: a, Deposit: deposit}

	if err := s.setUp(ctx, rep); err != nil {
		return nil, err
	}
	var err error
	if rep.BalanceStart, err = s.balance(ctx); err != nil {
		return nil, err
	}
	for _, sc := range []func(context.Context) (*stormOutcome, error){s.oneToken, s.manyTokens, s.payments} {
		o, err := sc(ctx)
		if err != nil {
			return nil, err
		}
		rep.Scenarios = append(rep.Scenarios, o)
	}

	// The whole journal: it sums to the balance, which moved by exactly
	// what the three scenarios should have moved.
	if rep.BalanceEnd, err = s.balance(ctx); err != nil {
		return nil, err
	}
	rep.ExpectedBalanceEnd = rep.BalanceStart - a - b - c
	entries, err := s.ledger(ctx)
	if err != nil {
		return nil, err
	}
	rep.LedgerEntries = len(entries)
	kinds := map[string]int{}
	for _, e := range entries {
		rep.LedgerSum += e.amount
		kinds[e.kind]++
	}
	rep.check("the balance moved by the three scenarios' amounts", rep.BalanceEnd, rep.ExpectedBalanceEnd)
	rep.check("the ledger sums to the balance", rep.LedgerSum, rep.BalanceEnd)
	rep.check("ledger entries: deposits, withdrawals, payments", fmt.Sprint(kinds["deposit"], ", ", kinds["withdrawal"], ", ", kinds["payment"]), "1, 2, 1")

	rep.Pass = true
	for _, v := range rep.Checks {
		rep.Pass = rep.Pass && v.Pass
	}
	for _, o := range rep.Scenarios {
		o.Pass = true
		for _, v := range o.Checks {
			o.Pass = o.Pass && v.Pass
		}
		rep.Pass = rep.Pass && o.Pass
	}
	rep.DurationMS = time.Since(began).Milliseconds()
	return rep, nil
}

// setUp checks the target answers, signs up a fresh user and deposits.
func (s *stormer) setUp(ctx context.Context, rep *stormReport) error {
	if h := s.send(ctx, "GET", "/healthz", "", ""); h.err != nil || h.status != http.StatusOK {
		return fmt.Errorf("storm: cannot reach the service at %s (%s): is the service running? start it with go run ./cmd/onceguard", s.cfg.Target, h)
	}
	done := s.progress.start("sign up and deposit", 4)
	defer done()

	rep.User = "storm_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(stormRandom(10)))
	cred, _ := json.Marshal(map[string]string{"username": rep.User, "password": base64.RawURLEncoding.EncodeToString(stormRandom(18))})
	if a := s.send(ctx, "POST", "/api/v1/users", "", string(cred)); a.status != http.StatusCreated {
		return fmt.Errorf("storm: sign up as %s: %s; want 201", rep.User, a)
	}
	s.progress.step()
	sess := s.send(ctx, "POST", "/api/v1/sessions", "", string(cred))
	if s.token = sess.str("token"); sess.status != http.StatusCreated || s.token == "" {
		return fmt.Errorf("storm: sign in as %s: %s; want 201 with a token", rep.User, sess)
	}
	s.progress.step()

	key, err := s.submitToken(ctx, "deposit")
	if err != nil {
		return err
	}
	s.progress.step()
	dep := s.send(ctx, "POST", "/api/v1/deposits", key, fmt.Sprintf(`{"amount":"%s"}`, rep.Deposit))
	if dep.status != http.StatusCreated {
		return fmt.Errorf("storm: deposit %s: %s; want 201 (a service with a lower --max-amount needs a lower --n or --amount)", rep.Deposit, dep)
	}
	s.progress.step()
	// An external provider may leave the deposit pending until it settles.
	for st := dep.str("status"); st != "succeeded"; {
		if st == "failed" {
			return fmt.Errorf("storm: deposit %s failed at the payment provider", rep.Deposit)
		}
		if bal, err := s.balance(ctx); err != nil || bal == rep.Deposit {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("storm: deposit %s still %s: %w", rep.Deposit, st, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		st = s.send(ctx, "GET", "/api/v1/deposits/"+dep.str("id"), "", "").str("status")
	}
	return nil
}

// oneToken is scenario (a): n withdrawals with one submit token.
func (s *stormer) oneToken(ctx context.Context) (*stormOutcome, error) {
	n, amt := s.cfg.N, s.cfg.Amount
	o := &stormOutcome{Name: "a", Title: fmt.Sprintf("1 submit token, %d withdrawals", n), Sent: n, ExpectedMoneyMoved: amt}
	tok, err := s.submitToken(ctx, "withdrawal")
	if err != nil {
		return nil, err
	}
	body := fmt.Sprintf(`{"amount":"%s"}`, amt)
	answers, err := s.measure(ctx, o, func() []stormAnswer {
		return s.fire(ctx, "("+o.Name+") "+o.Title, n, n, func(int) stormAnswer { return s.send(ctx, "POST", "/api/v1/withdrawals", tok, body) })
	})
	if err != nil {
		return nil, err
	}
	fresh, ids, other := 0, map[string]bool{}, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			ids[a.str("id")] = true
			if !a.replayed {
				fresh++
			}
		case a.status == http.StatusConflict && a.code == "request_in_progress":
		default:
			other++
		}
	}
	o.check("new withdrawals (201 not replayed)", fresh, 1)
	o.check("withdrawal ids among the 201s", len(ids), 1)
	o.check("answers other than 201 or 409 request_in_progress", other, 0)
	o.check("money moved", o.MoneyMoved, o.ExpectedMoneyMoved)
	// The transient 409s are not stored: once the first finished, the same
	// token replays its answer.
	again := s.send(ctx, "POST", "/api/v1/withdrawals", tok, body)
	o.check("the token once more, after the storm", fmt.Sprint(again.status, " replayed=", again.replayed, " same id=", ids[again.str("id")]), "201 replayed=true same id=true")
	return o, s.movements(ctx, o, "/api/v1/withdrawals", 1)
}

// manyTokens is scenario (b): n withdrawals with n submit tokens and one
// body. (a)'s body is still inside the repeat window, so (b) withdraws an
// amount of its own.
func (s *stormer) manyTokens(ctx context.Context) (*stormOutcome, error) {
	n, amt := s.cfg.N, s.cfg.Amount+1
	o := &stormOutcome{Name: "b", Title: fmt.Sprintf("%d submit tokens, one body", n), Sent: n, ExpectedMoneyMoved: amt}
	toks, err := s.submitTokens(ctx, "(b) minting", "withdrawal", n)
	if err != nil {
		return nil, err
	}
	body := fmt.Sprintf(`{"amount":"%s"}`, amt)
	answers, err := s.measure(ctx, o, func() []stormAnswer {
		return s.fire(ctx, "("+o.Name+") "+o.Title, n, n, func(i int) stormAnswer { return s.send(ctx, "POST", "/api/v1/withdrawals", toks[i], body) })
	})
	if err != nil {
		return nil, err
	}
	created, dup, noRetry := 0, 0, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			created++
		case a.status == http.StatusTooManyRequests && a.code == "duplicate_submission":
			dup++
			if a.retryAfter == "" {
				noRetry++
			}
		}
	}
	o.check("accepted (201)", created, 1)
	o.check("429 duplicate_submission", dup, n-1)
	o.check("429s without Retry-After", noRetry, 0)
	o.check("money moved", o.MoneyMoved, o.ExpectedMoneyMoved)
	return o, s.movements(ctx, o, "/api/v1/withdrawals", 2)
}

// payments is scenario (c): n payments of one order, each with a key of
// its own (a submit token, so that a service requiring them for payments
// takes part too).
func (s *stormer) payments(ctx context.Context) (*stormOutcome, error) {
	n, price := s.cfg.N, s.cfg.Amount+2
	o := &stormOutcome{Name: "c", Title: fmt.Sprintf("%d keys, payments of one order", n), Sent: n, ExpectedMoneyMoved: price}
	key, err := s.submitToken(ctx, "order")
	if err != nil {
		return nil, err
	}
	ord := s.send(ctx, "POST", "/api/v1/orders", key, fmt.Sprintf(`{"amount":"%s","description":"onceguard storm"}`, price))
	id := ord.str("id")
	if ord.status != http.StatusCreated || id == "" {
		return nil, fmt.Errorf("storm: create an order of %s: %s; want 201", price, ord)
	}
	keys, err := s.submitTokens(ctx, "(c) minting", "payment", n)
	if err != nil {
		return nil, err
	}
	path := "/api/v1/orders/" + id + "/payment"
	answers, err := s.measure(ctx, o, func() []stormAnswer {
		return s.fire(ctx, "("+o.Name+") "+o.Title, n, n, func(i int) stormAnswer { return s.send(ctx, "POST", path, keys[i], `{"method":"wallet"}`) })
	})
	if err != nil {
		return nil, err
	}
	paid, refused := 0, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			paid++
		case a.status == http.StatusConflict && (a.code == "order_already_paid" || a.code == "payment_in_progress"):
			refused++
		}
	}
	o.check("paid (201)", paid, 1)
	o.check("409 order_already_paid or payment_in_progress", refused, n-1)
	o.check("money moved", o.MoneyMoved, o.ExpectedMoneyMoved)
	o.check("order status", s.send(ctx, "GET", "/api/v1/orders/"+id, "", "").str("status"), "paid")
	entries, err := s.ledger(ctx)
	if err != nil {
		return nil, err
	}
	var sum money.Amount
	payments := 0
	for _, e := range entries {
		sum += e.amount
		if e.kind == "payment" {
			payments++
		}
	}
	bal, err := s.balance(ctx)
	if err != nil {
		return nil, err
	}
	o.check("payment entries in the ledger", payments, 1)
	o.check("the ledger sums to the balance", sum, bal)
	return o, nil
}

// measure runs a storm between two readings of the balance and counts its
// answers into o.
func (s *stormer) measure(ctx context.Context, o *stormOutcome, storm func() []stormAnswer) ([]stormAnswer, error) {
	before, err := s.balance(ctx)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	answers := storm()
	o.DurationMS = time.Since(began).Milliseconds()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	after, err := s.balance(ctx)
	if err != nil {
		return nil, err
	}
	o.MoneyMoved = before - after
	counts := map[stormCount]int{}
	for _, a := range answers {
		k := stormCount{Status: a.status, Code: a.code, Replayed: a.replayed}
		if a.err != nil {
			k.Code = "no_answer"
		}
		counts[k]++
	}
	for k, c := range counts {
		k.Count = c
		o.Answers = append(o.Answers, k)
	}
	slices.SortFunc(o.Answers, func(x, y stormCount) int {
		if x.Status != y.Status {
			return x.Status - y.Status
		}
		if x.Replayed != y.Replayed { // the first answer before its replays
			if x.Replayed {
				return 1
			}
			return -1
		}
		if x.Count != y.Count {
			return y.Count - x.Count
		}
		return strings.Compare(x.Code, y.Code)
	})
	for _, a := range answers {
		if a.err != nil { // say why, once
			o.check("requests without an HTTP answer", a.err.Error(), "none")
			break
		}
	}
	return answers, nil
}

// movements checks the user's list at path holds want items.
func (s *stormer) movements(ctx context.Context, o *stormOutcome, path string, want int) error {
	a := s.send(ctx, "GET", path, "", "")
	if a.status != http.StatusOK {
		return fmt.Errorf("storm: GET %s: %s; want 200", path, a)
	}
	items, _ := a.body["items"].([]any)
	o.check("withdrawals recorded so far", len(items), want)
	return nil
}

// fire sends n requests, at most parallel at a time, released together,
// and returns their answers by index.
func (s *stormer) fire(ctx context.Context, label string, n, parallel int, send func(i int) stormAnswer) []stormAnswer {
	done := s.progress.start(label, n)
	defer done()
	out := make([]stormAnswer, n)
	next := atomic.Int64{}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			<-start
			for i := int(next.Add(1)) - 1; i < n && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				out[i] = send(i)
				s.progress.step()
			}
		})
	}
	close(start) // all at once: the point of a storm
	wg.Wait()
	return out
}
