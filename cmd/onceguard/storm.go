package main

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/internal/money"
)

// stormConfig is what `onceguard storm` is told (its flags).
type stormConfig struct {
	target  string
	n       int
	amount  money.Amount
	timeout time.Duration
	json    bool
}

// stormMaxN bounds --n: every scenario opens n connections at once.
const stormMaxN = 5000

// runStorm fires a duplicate storm at a running service (issue 7) as a
// fresh user: a deposit large enough to pay every request of the storm,
// then three scenarios of n concurrent requests, each of which must move
// money exactly once:
//
//	(a) n withdrawals with one submit token: one debit, the rest replays
//	    or 409 request_in_progress;
//	(b) n withdrawals with n submit tokens and one body: one accepted, the
//	    rest 429 duplicate_submission (the repeat window);
//	(c) n payments of one order with n keys: paid once.
//
// It prints a summary table (or, with --json, one JSON document) to stdout
// and a progress bar to stderr when stderr is a terminal. It returns an
// error when a scenario fails or the target cannot be reached.
// stormFlags defines storm's flags (--amount is read as text, checked by
// runStorm).
func stormFlags(env *envVars, stderr io.Writer) (*flag.FlagSet, *stormConfig, *string) {
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &stormConfig{}
	amount := new(string)
	fs.StringVar(&c.target, "target", env.str("ONCEGUARD_STORM_TARGET", "http://127.0.0.1:8080"), "base URL of a running onceguard service [ONCEGUARD_STORM_TARGET]")
	fs.IntVar(&c.n, "n", env.int("ONCEGUARD_STORM_N", 50), "concurrent requests in each scenario [ONCEGUARD_STORM_N]")
	fs.StringVar(amount, "amount", env.str("ONCEGUARD_STORM_AMOUNT", "10.00"), "amount of the withdrawals of (a); (b) uses it + 0.01 and (c)'s order it + 0.02 [ONCEGUARD_STORM_AMOUNT]")
	fs.DurationVar(&c.timeout, "timeout", env.dur("ONCEGUARD_STORM_TIMEOUT", 2*time.Minute), "bound on the whole storm [ONCEGUARD_STORM_TIMEOUT]")
	fs.BoolVar(&c.json, "json", env.bool("ONCEGUARD_STORM_JSON", false), "print one JSON document instead of the table [ONCEGUARD_STORM_JSON]")
	return fs, c, amount
}

func runStorm(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env := &envVars{getenv: getenv}
	fs, c, amount := stormFlags(env, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := env.err(fs); err != nil {
		return fmt.Errorf("storm: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("storm: unexpected arguments %q", fs.Args())
	}
	if c.n < 2 || c.n > stormMaxN {
		return fmt.Errorf("storm: --n %d: want 2..%d", c.n, stormMaxN)
	}
	var err error
	if c.amount, err = money.Parse(*amount); err != nil || c.amount <= 0 || c.amount > 1_000_000_00 {
		return fmt.Errorf("storm: --amount %q: want an amount like 10.00, at most 1000000.00", *amount)
	}
	if c.timeout <= 0 {
		return fmt.Errorf("storm: --timeout %v: want a positive duration", c.timeout)
	}
	c.target = strings.TrimRight(c.target, "/")
	if !strings.HasPrefix(c.target, "http://") && !strings.HasPrefix(c.target, "https://") {
		return fmt.Errorf("storm: --target %q: want a URL like http://127.0.0.1:8080", c.target)
	}

	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = c.n+16, c.n+16 // keep the storm's connections for the next scenario
	defer tr.CloseIdleConnections()
	s := &stormer{cfg: *c, hc: &http.Client{Transport: tr}, progress: newStormProgress(stderr, getenv)}

	rep, err := s.run(ctx)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("storm: gave up after --timeout %v: %w", c.timeout, err)
		}
		return err
	}
	if c.json {
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

// stormReport is the storm's result, printed as a table or as JSON.
type stormReport struct {
	Target             string          `json:"target"`
	User               string          `json:"user"`
	N                  int             `json:"n"`
	Amount             money.Amount    `json:"amount"`
	Deposit            money.Amount    `json:"deposit"`
	Scenarios          []*stormOutcome `json:"scenarios"`
	BalanceStart       money.Amount    `json:"balance_start"`
	BalanceEnd         money.Amount    `json:"balance_end"`
	ExpectedBalanceEnd money.Amount    `json:"expected_balance_end"`
	LedgerSum          money.Amount    `json:"ledger_sum"`
	LedgerEntries      int             `json:"ledger_entries"`
	Checks             []stormVerdict  `json:"checks"` // over the whole storm
	Pass               bool            `json:"pass"`
	DurationMS         int64           `json:"duration_ms"`
}

// stormOutcome is one scenario's line of the table.
type stormOutcome struct {
	Name               string         `json:"name"` // "a", "b", "c"
	Title              string         `json:"title"`
	Sent               int            `json:"sent"`
	Answers            []stormCount   `json:"answers"` // by status; a first answer before its replays; then most frequent first
	MoneyMoved         money.Amount   `json:"money_moved"`
	ExpectedMoneyMoved money.Amount   `json:"expected_money_moved"`
	Checks             []stormVerdict `json:"checks"`
	Pass               bool           `json:"pass"`
	DurationMS         int64          `json:"duration_ms"`
}

// stormCount is how many answers of a scenario had one status and code.
type stormCount struct {
	Status   int    `json:"status"` // 0: no HTTP answer (a transport error)
	Code     string `json:"code"`   // the problem's code; "" for a success
	Replayed bool   `json:"replayed"`
	Count    int    `json:"count"`
}

// stormVerdict is one "exactly once" check of a scenario.
type stormVerdict struct {
	Check string `json:"check"`
	Pass  bool   `json:"pass"`
	Got   string `json:"got"`
	Want  string `json:"want"`
}

func (o *stormOutcome) check(name string, got, want any) {
	o.Checks = stormCheck(o.Checks, name, got, want)
}

func (r *stormReport) check(name string, got, want any) {
	r.Checks = stormCheck(r.Checks, name, got, want)
}

func stormCheck(checks []stormVerdict, name string, got, want any) []stormVerdict {
	g, w := fmt.Sprint(got), fmt.Sprint(want)
	return append(checks, stormVerdict{Check: name, Pass: g == w, Got: g, Want: w})
}

// stormAnswer is one HTTP answer as the storm sees it.
type stormAnswer struct {
	status     int
	code       string
	replayed   bool
	retryAfter string
	body       map[string]any
	err        error // no answer at all
}

func (a stormAnswer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	if a.code != "" {
		return fmt.Sprintf("%d %s", a.status, a.code)
	}
	return strconv.Itoa(a.status)
}

func (a stormAnswer) str(field string) string { s, _ := a.body[field].(string); return s }

// stormer runs the storm as one user.
type stormer struct {
	cfg      stormConfig
	hc       *http.Client
	token    string // the user's session
	progress *stormProgress
}

func (s *stormer) run(ctx context.Context) (*stormReport, error) {
	began := time.Now()
	a, b, c := s.cfg.amount, s.cfg.amount+1, s.cfg.amount+2
	n := money.Amount(s.cfg.n)
	// Enough to pay every request of every scenario: if the guard let a
	// duplicate through, the balance would not stop it and the storm would
	// see it.
	deposit := n * (a + b + c)
	if deposit/n != a+b+c || deposit > 1_000_000_00 {
		return nil, fmt.Errorf("storm: --n %d × --amount %s needs a deposit of over 1000000.00, the service's default --max-amount; lower --n or --amount", s.cfg.n, s.cfg.amount)
	}
	rep := &stormReport{Target: s.cfg.target, N: s.cfg.n, Amount: a, Deposit: deposit}

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
		return fmt.Errorf("storm: cannot reach the service at %s (%s): is the service running? start it with go run ./cmd/onceguard", s.cfg.target, h)
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
	n, amt := s.cfg.n, s.cfg.amount
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
	n, amt := s.cfg.n, s.cfg.amount+1
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
	n, price := s.cfg.n, s.cfg.amount+2
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

func (s *stormer) submitToken(ctx context.Context, purpose string) (string, error) {
	a := s.send(ctx, "POST", "/api/v1/submit-tokens", "", fmt.Sprintf(`{"purpose":%q}`, purpose))
	if tok := a.str("token"); a.status == http.StatusCreated && tok != "" {
		return tok, nil
	}
	return "", fmt.Errorf("storm: mint a %s submit token: %s; want 201", purpose, a)
}

// submitTokens mints n tokens, a few at a time.
func (s *stormer) submitTokens(ctx context.Context, label, purpose string, n int) ([]string, error) {
	answers := s.fire(ctx, fmt.Sprintf("%s %d %s tokens", label, n, purpose), n, min(n, 8), func(int) stormAnswer {
		return s.send(ctx, "POST", "/api/v1/submit-tokens", "", fmt.Sprintf(`{"purpose":%q}`, purpose))
	})
	toks := make([]string, n)
	for i, a := range answers {
		if toks[i] = a.str("token"); a.status != http.StatusCreated || toks[i] == "" {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("storm: mint a %s submit token: %s; want 201", purpose, a)
		}
	}
	return toks, nil
}

func (s *stormer) balance(ctx context.Context) (money.Amount, error) {
	a := s.send(ctx, "GET", "/api/v1/account", "", "")
	bal, err := money.Parse(a.str("balance"))
	if a.status != http.StatusOK || err != nil {
		return 0, fmt.Errorf("storm: read the balance: %s; want 200 with a balance", a)
	}
	return bal, nil
}

type stormEntry struct {
	kind   string
	amount money.Amount
}

func (s *stormer) ledger(ctx context.Context) ([]stormEntry, error) {
	a := s.send(ctx, "GET", "/api/v1/ledger", "", "")
	if a.status != http.StatusOK {
		return nil, fmt.Errorf("storm: read the ledger: %s; want 200", a)
	}
	items, _ := a.body["items"].([]any)
	out := make([]stormEntry, 0, len(items))
	for _, it := range items {
		m, _ := it.(map[string]any)
		kind, _ := m["kind"].(string)
		text, _ := m["amount"].(string)
		amt, err := money.Parse(strings.TrimPrefix(text, "-"))
		if err != nil {
			return nil, fmt.Errorf("storm: ledger amount %q: %w", text, err)
		}
		if strings.HasPrefix(text, "-") {
			amt = -amt
		}
		out = append(out, stormEntry{kind, amt})
	}
	return out, nil
}

// send makes one request as the user; a transport error is in the answer.
func (s *stormer) send(ctx context.Context, method, path, key, body string) stormAnswer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.cfg.target+path, rd)
	if err != nil {
		return stormAnswer{err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return stormAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return stormAnswer{err: err}
	}
	a := stormAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", retryAfter: resp.Header.Get("Retry-After")}
	_ = json.Unmarshal(raw, &a.body) // a body that is not JSON leaves no code
	a.code = a.str("code")
	return a
}

func stormRandom(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

// writeTable prints the report for people.
func (r *stormReport) writeTable(w io.Writer) {
	fmt.Fprintf(w, "onceguard storm against %s\n", r.Target)
	fmt.Fprintf(w, "user %s, deposit %s (enough to pay every request), %d concurrent requests per scenario\n\n", r.User, r.Deposit, r.N)
	rows := [][]string{{"SCENARIO", "SENT", "ANSWER", "COUNT", "MOVED", "EXPECTED", "RESULT"}}
	for _, o := range r.Scenarios {
		verdict := "PASS"
		if !o.Pass {
			verdict = "FAIL"
		}
		for i, c := range o.Answers {
			answer := strconv.Itoa(c.Status)
			if c.Status == 0 {
				answer = "-"
			}
			if c.Code != "" {
				answer += " " + c.Code
			}
			if c.Replayed {
				answer += " (replayed)"
			}
			row := []string{"", "", answer, strconv.Itoa(c.Count), "", "", ""}
			if i == 0 {
				row[0], row[1], row[4], row[5], row[6] = "("+o.Name+") "+o.Title, strconv.Itoa(o.Sent), o.MoneyMoved.String(), o.ExpectedMoneyMoved.String(), verdict
			}
			rows = append(rows, row)
		}
	}
	stormColumns(w, rows, []bool{false, true, false, true, true, true, false})
	fmt.Fprintln(w)
	ledger := "sum"
	if r.LedgerSum != r.BalanceEnd {
		ledger = "do NOT sum"
	}
	fmt.Fprintf(w, "balance %s -> %s (expected %s); the ledger's %d entries %s to %s\n",
		r.BalanceStart, r.BalanceEnd, r.ExpectedBalanceEnd, r.LedgerEntries, ledger, r.LedgerSum)
	for _, o := range r.Scenarios {
		for _, v := range o.Checks {
			if !v.Pass {
				fmt.Fprintf(w, "FAIL (%s) %s: got %s; want %s\n", o.Name, v.Check, v.Got, v.Want)
			}
		}
	}
	for _, v := range r.Checks {
		if !v.Pass {
			fmt.Fprintf(w, "FAIL %s: got %s; want %s\n", v.Check, v.Got, v.Want)
		}
	}
	sent := 0
	for _, o := range r.Scenarios {
		sent += o.Sent
	}
	took := (time.Duration(r.DurationMS) * time.Millisecond).Round(10 * time.Millisecond)
	if r.Pass {
		fmt.Fprintf(w, "PASS: every scenario moved money exactly once (%d storm requests, %v)\n", sent, took)
	} else {
		fmt.Fprintf(w, "FAIL: money did not move exactly once (%d storm requests, %v)\n", sent, took)
	}
}

// stormColumns prints rows as columns two spaces apart; right[i] aligns
// column i to the right.
func stormColumns(w io.Writer, rows [][]string, right []bool) {
	width := make([]int, len(right))
	for _, r := range rows {
		for i, cell := range r {
			width[i] = max(width[i], len(cell))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, cell := range r {
			pad := strings.Repeat(" ", width[i]-len(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if right[i] {
				b.WriteString(pad + cell)
			} else {
				b.WriteString(cell + pad)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// stormProgress shows how far the storm is: a redrawn bar when its writer
// is a terminal, one plain line per finished phase otherwise (no escape
// sequences into a file or a pipe).
type stormProgress struct {
	w   io.Writer
	tty bool

	mu    sync.Mutex // guards label, total, began and w's writes
	label string
	total int
	began time.Time
	done  atomic.Int64
}

func newStormProgress(w io.Writer, getenv func(string) string) *stormProgress {
	tty := false
	if f, ok := w.(*os.File); ok && getenv("TERM") != "dumb" {
		fi, err := f.Stat()
		tty = err == nil && fi.Mode()&os.ModeCharDevice != 0
	}
	return &stormProgress{w: w, tty: tty}
}

// start begins a phase of total steps; the returned func ends it.
func (p *stormProgress) start(label string, total int) (end func()) {
	p.mu.Lock()
	p.label, p.total, p.began = label, total, time.Now()
	p.done.Store(0)
	p.mu.Unlock()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		if !p.tty {
			<-stop
			return
		}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			p.draw()
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		p.mu.Lock()
		defer p.mu.Unlock()
		took := time.Since(p.began).Round(time.Millisecond)
		if p.tty {
			p.drawLocked()
			fmt.Fprintf(p.w, " %v\n", took)
		} else {
			fmt.Fprintf(p.w, "storm: %s: %d/%d in %v\n", p.label, p.done.Load(), p.total, took)
		}
	}
}

func (p *stormProgress) step() { p.done.Add(1) }

func (p *stormProgress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked()
}

func (p *stormProgress) drawLocked() {
	const width = 30
	done := min(int(p.done.Load()), p.total)
	filled := width
	if p.total > 0 {
		filled = width * done / p.total
	}
	fmt.Fprintf(p.w, "\r\x1b[2K%-36s [%s%s] %d/%d", p.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, p.total)
}
