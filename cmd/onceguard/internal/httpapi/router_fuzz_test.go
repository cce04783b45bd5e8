package httpapi_test

// FuzzRouter drives the whole service (httpapi.New wired as `onceguard
// serve` wires it, on a real SQLite database in a temp dir, the simulated
// provider in process) with random requests read off the wire by
// net/http: any method, request target, headers, Idempotency-Key and body,
// signed in or not. After every request it checks the answer and the
// books:
//
//   - no panic; no 5xx but a 503 problem with a code (500 is a bug);
//   - every 4xx/5xx is application/problem+json with a snake_case code and
//     its status; 404 is not_found, 405 method_not_allowed with Allow, 413
//     body_too_large;
//   - Retry-After, when sent, is whole seconds; 429 duplicate_submission,
//     409 request_in_progress / payment_in_progress and 503 carry it;
//   - /api/ answers are not cacheable; every answer has a safe
//     X-Request-Id; a replay never sets a cookie;
//   - amounts and balances in answers are strings with two decimals;
//   - another user's resources are never served, and never leak;
//   - signing out stops the token at once;
//   - the books: no balance below zero, each ledger sums to its balance,
//     the provider's charges and payouts match the succeeded deposits and
//     withdrawals one to one and the ledger, every order is paid at most
//     once and its payment is in the ledger, no (user, key) moved money
//     twice.
//
// Paths may hold placeholders for real ids made in the setup: {order}
// (the fuzz user's, affordable), {bigorder} (theirs, not affordable),
// {dep}, {wd}, {other} and {otherdep} (another user's order and deposit).
// mode picks the credentials (bits 0-1: none, Bearer, cookie, the other
// user's Bearer) and the Idempotency-Key (bits 2-3: none, key as given,
// a fresh submit token for the purpose named by key or the path, the last
// token minted again).
//
//	go test -run XXX -fuzz FuzzRouter -fuzztime 60s -parallel 1 ./internal/httpapi/

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/auth"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/web"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/sqldialect"
)

type fuzzUser struct{ id, name, token string }

type routerHarness struct {
	h       http.Handler
	db      *sql.DB
	store   *sqlstore.Store
	sim     *psp.Sim
	dialect sqldialect.Dialect
	me, him fuzzUser
	ids     map[string]string // placeholder -> id
	last    string            // the last submit token minted
}

const fuzzPassword = "fuzz-password-1"

// openSQLite opens a SQLite file under dir as serve() does.
func openSQLite(tb testing.TB, dir string) *sql.DB {
	tb.Helper()
	dsn := "file:" + filepath.Join(dir, "fuzz.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// newRouterHarness wires the service as cmd/onceguard serve() does, on
// db, and makes two users with sessions, money and orders.
func newRouterHarness(tb testing.TB, db *sql.DB, dialect sqldialect.Dialect) *routerHarness {
	tb.Helper()
	ctx := context.Background()
	if err := sqlstore.Migrate(ctx, db, dialect); err != nil {
		tb.Fatal(err)
	}
	keys, err := idemsql.New(db, dialect, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := keys.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	sim := &psp.Sim{}
	metrics := obs.NewMetrics()
	store := sqlstore.Open(db, dialect)
	store.Observe = metrics.DBObserver()
	store.Records = keys
	maxAmount, _ := money.Parse("1000000.00")
	svc := app.New(app.Config{
		Store: store, Provider: psp.Port(obs.Provider{Provider: sim, Metrics: metrics}), Currency: "CNY", MaxAmount: maxAmount,
		KeyLease: 30 * time.Second, LockTTL: 10 * time.Second, SessionTTL: 24 * time.Hour, Metrics: metrics,
		Locks: lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true}),
	})
	h := httpapi.New(httpapi.Config{
		App: svc, Keys: keys,
		RequireToken: map[string]bool{"withdrawal": true}, Window: 10 * time.Second, KeyTTL: 24 * time.Hour,
		TokenTTL: 5 * time.Minute, Ping: db.PingContext, Web: web.Handler(),
		Metrics: metrics, Logger: slog.New(slog.DiscardHandler),
	})
	hs := &routerHarness{h: h, db: db, store: store, sim: sim, dialect: dialect, ids: map[string]string{}}
	hs.me = hs.signUp(tb, "fuzzer")
	hs.him = hs.signUp(tb, "other_user")
	hs.ids["{dep}"] = hs.setup(tb, hs.me, "POST", "/api/v1/deposits", "setup-dep", `{"amount":"1000.00"}`)["id"]
	hs.ids["{order}"] = hs.setup(tb, hs.me, "POST", "/api/v1/orders", "setup-order", `{"amount":"5","description":"fuzz"}`)["id"]
	hs.ids["{bigorder}"] = hs.setup(tb, hs.me, "POST", "/api/v1/orders", "setup-bigorder", `{"amount":"999999.99"}`)["id"]
	st := hs.setup(tb, hs.me, "POST", "/api/v1/submit-tokens", "", `{"purpose":"withdrawal"}`)["token"]
	hs.ids["{wd}"] = hs.setup(tb, hs.me, "POST", "/api/v1/withdrawals", st, `{"amount":"1.00"}`)["id"]
	hs.ids["{otherdep}"] = hs.setup(tb, hs.him, "POST", "/api/v1/deposits", "setup-dep", `{"amount":"50"}`)["id"]
	hs.ids["{other}"] = hs.setup(tb, hs.him, "POST", "/api/v1/orders", "setup-order", `{"amount":"1"}`)["id"]
	hs.checkBooks(tb)
	return hs
}

// call sends a request built in the test (not fuzzed) and decodes its
// JSON answer.
func (hs *routerHarness) call(tb testing.TB, u fuzzUser, method, path, key, body string) (int, map[string]string) {
	tb.Helper()
	w := serveJSON(hs.h, u.token, method, path, key, body)
	out := map[string]string{}
	_ = json.Unmarshal(w.Body.Bytes(), &out) // non-string members are left out
	return w.Code, out
}

func (hs *routerHarness) setup(tb testing.TB, u fuzzUser, method, path, key, body string) map[string]string {
	tb.Helper()
	code, out := hs.call(tb, u, method, path, key, body)
	if code/100 != 2 {
		tb.Fatalf("setup %s %s: %d %v", method, path, code, out)
	}
	return out
}

func (hs *routerHarness) signUp(tb testing.TB, name string) fuzzUser {
	tb.Helper()
	creds := `{"username":"` + name + `","password":"` + fuzzPassword + `"}`
	u := fuzzUser{name: name, id: hs.setup(tb, fuzzUser{}, "POST", "/api/v1/users", "", creds)["id"]}
	return hs.signIn(tb, u)
}

func (hs *routerHarness) signIn(tb testing.TB, u fuzzUser) fuzzUser {
	tb.Helper()
	u.token = hs.setup(tb, fuzzUser{}, "POST", "/api/v1/sessions", "", `{"username":"`+u.name+`","password":"`+fuzzPassword+`"}`)["token"]
	if u.token == "" {
		tb.Fatalf("no session token for %s", u.name)
	}
	return u
}

// newSession gives u a new session straight in the store, as a sign-in
// does (no password hashing, no sign-in rate limit to trip over).
func (hs *routerHarness) newSession(tb testing.TB, u fuzzUser) fuzzUser {
	tb.Helper()
	tok, hash := auth.NewSessionToken()
	now := time.Now()
	if err := hs.store.CreateSession(context.Background(), hash, u.id, now.Add(24*time.Hour), now); err != nil {
		tb.Fatalf("new session for %s: %v", u.name, err)
	}
	u.token = tok
	return u
}

// purposeOf is the submit token purpose a path's route needs.
func purposeOf(key, path string) string {
	switch {
	case key == "withdrawal" || key == "deposit" || key == "order" || key == "payment":
		return key
	case strings.HasSuffix(path, "/payment"):
		return "payment"
	case strings.Contains(path, "deposits"):
		return "deposit"
	case strings.Contains(path, "orders"):
		return "order"
	}
	return "withdrawal"
}

// checkBooks checks the invariants of the money.
func (hs *routerHarness) checkBooks(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	for _, u := range []fuzzUser{hs.me, hs.him} {
		bal, sum, err := hs.store.Balance(ctx, u.id)
		if err != nil {
			tb.Fatalf("Balance(%s): %v", u.name, err)
		}
		if bal < 0 || bal != sum {
			tb.Fatalf("%s: balance %s, ledger sums to %s; want equal and not negative", u.name, bal, sum)
		}
	}
	one := func(query string) (n, total int64) {
		tb.Helper()
		if err := hs.db.QueryRowContext(ctx, query).Scan(&n, &total); err != nil {
			tb.Fatalf("%s: %v", query, err)
		}
		return n, total
	}
	// The provider moved money exactly for the succeeded movements.
	for _, c := range []struct {
		kind  psp.Kind
		table string
	}{{psp.Charge, "deposits"}, {psp.Payout, "withdrawals"}} {
		simN, simTotal := hs.sim.Moved(c.kind)
		n, total := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM ` + c.table + ` WHERE status = 'succeeded'`)
		if int64(simN) != n || int64(simTotal) != total {
			pn, pending := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM ` + c.table + ` WHERE status = 'pending'`)
			tb.Fatalf("provider %s: %d moving %s; the service's succeeded %s: %d moving %s (pending: %d, %s)",
				c.kind, simN, simTotal, c.table, n, money.Amount(total), pn, money.Amount(pending))
		}
		if dup, _ := one(`SELECT COUNT(*), 0 FROM (SELECT user_id, idempotency_key FROM ` + c.table + ` GROUP BY user_id, idempotency_key HAVING COUNT(*) > 1) d`); dup != 0 {
			tb.Fatalf("%s: %d (user, key) pairs moved money more than once", c.table, dup)
		}
	}
	// The ledger: deposits credited when they succeed; withdrawals debited
	// when recorded, refunded when they fail; payments debited.
	ledger := func(kind string) int64 {
		_, sum := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM ledger WHERE kind = '` + kind + `'`)
		return sum
	}
	_, deposited := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM deposits WHERE status = 'succeeded'`)
	_, withdrawn := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM withdrawals`)
	_, refunded := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM withdrawals WHERE status = 'failed'`)
	_, paid := one(`SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM payments`)
	for _, c := range []struct {
		kind       string
		got, table int64
	}{{"deposit", ledger("deposit"), deposited}, {"withdrawal", ledger("withdrawal"), -withdrawn},
		{"withdrawal_refund", ledger("withdrawal_refund"), refunded}, {"payment", ledger("payment"), -paid}} {
		if c.got != c.table {
			tb.Fatalf("ledger %s entries sum to %s; the movements to %s", c.kind, money.Amount(c.got), money.Amount(c.table))
		}
	}
	if bad, _ := one(`SELECT COUNT(*), 0 FROM orders o WHERE (status = 'paid') <> ((SELECT COUNT(*) FROM payments p WHERE p.order_id = o.id) = 1) OR (SELECT COUNT(*) FROM payments p WHERE p.order_id = o.id) > 1`); bad != 0 {
		tb.Fatalf("%d orders whose status and payments disagree (paid once, exactly when status is paid)", bad)
	}
}

var (
	codeRE    = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	reqIDRE   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	amountOut = regexp.MustCompile(`^-?(0|[1-9][0-9]*)\.[0-9]{2}$`)
)

// moneyFields fails if a member named like an amount or a balance, at
// any depth of v, is not a string with exactly two decimals.
func moneyFields(v any) (bad string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if k == "amount" || k == "balance" || k == "balance_after" {
				if s, ok := x.(string); !ok || !amountOut.MatchString(s) {
					return fmt.Sprintf("%s: %v", k, x)
				}
			}
			if b := moneyFields(x); b != "" {
				return b
			}
		}
	case []any:
		for _, x := range v {
			if b := moneyFields(x); b != "" {
				return b
			}
		}
	}
	return ""
}

func FuzzRouter(f *testing.F) {
	addRouterSeeds(f)
	hs := newRouterHarness(f, openSQLite(f, f.TempDir()), sqldialect.SQLite)
	f.Fuzz(func(t *testing.T, method, path string, mode uint8, key, headers string, body []byte) {
		hs.fuzz(t, method, path, mode, key, headers, body)
	})
}

// FuzzRouterPostgres is FuzzRouter on PostgreSQL (ONCEGUARD_TEST_POSTGRES,
// a database of its own), where text is stricter than in SQLite: no NUL,
// only valid UTF-8.
func FuzzRouterPostgres(f *testing.F) {
	addRouterSeeds(f)
	db, err := sql.Open("pgx", dbtest.FreshPostgres(f, "onceguard_fuzz_router"))
	if err != nil {
		f.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	f.Cleanup(func() { _ = db.Close() })
	hs := newRouterHarness(f, db, sqldialect.Postgres)
	f.Fuzz(func(t *testing.T, method, path string, mode uint8, key, headers string, body []byte) {
		hs.fuzz(t, method, path, mode, key, headers, body)
	})
}

// FuzzRouterMySQL is FuzzRouter on MySQL/MariaDB (ONCEGUARD_TEST_MYSQL, a
// database of its own).
func FuzzRouterMySQL(f *testing.F) {
	addRouterSeeds(f)
	db, err := sql.Open("mysql", dbtest.FreshMySQL(f, "onceguard_fuzz_router"))
	if err != nil {
		f.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	f.Cleanup(func() { _ = db.Close() })
	hs := newRouterHarness(f, db, sqldialect.MySQL)
	f.Fuzz(func(t *testing.T, method, path string, mode uint8, key, headers string, body []byte) {
		hs.fuzz(t, method, path, mode, key, headers, body)
	})
}

func addRouterSeeds(f *testing.F) {
	type seed struct {
		method, path string
		mode         uint8
		key, headers string
		body         string
	}
	const (
		bearer, cookie, otherBearer = 1, 2, 3
		withKey, freshToken, oldTok = 1 << 2, 2 << 2, 3 << 2
	)
	for _, s := range []seed{
		{"GET", "/healthz", 0, "", "", ""},
		{"GET", "/readyz", 0, "", "", ""},
		{"GET", "/metrics", 0, "", "", ""},
		{"GET", "/", 0, "", "", ""},
		{"GET", "/static/app.js", 0, "", "", ""},
		{"POST", "/api/v1/users", 0, "", "", `{"username":"fuzz_new","password":"long-enough"}`},
		{"POST", "/api/v1/users", 0, "", "", `{"username":"Fuzz New","password":"x"}`},
		{"POST", "/api/v1/users", 0, "", "", `{"username":"fuzzer","password":"long-enough","username":"x"}`},
		{"POST", "/api/v1/sessions", 0, "", "", `{"username":"fuzzer","password":"wrong-password"}`},
		{"GET", "/api/v1/account", bearer, "", "", ""},
		{"GET", "/api/v1/account", cookie, "", "", ""},
		{"GET", "/api/v1/account", 0, "", "Authorization: Bearer not-a-token", ""},
		{"GET", "/api/v1/account", 0, "", "Authorization: bearer x\nCookie: onceguard_session=\"\x00\"", ""},
		{"GET", "/api/v1/ledger", bearer, "", "", ""},
		{"POST", "/api/v1/submit-tokens", bearer, "", "", `{"purpose":"withdrawal"}`},
		{"POST", "/api/v1/submit-tokens", bearer, "", "", `{"purpose":"WITHDRAWAL"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k1", "", `{"amount":"10.00"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, `"k1"`, "", `{"amount":10}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k1", "", `{"amount":"10.01"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k2", "", `{"amount":"1e3"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k3", "", `{"amount":"-0"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k4", "", `{"amount":".5"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k5", "", `{"amount":"00.10"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k6", "", `{"amount":99999999999999999999999}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k7", "", `{"amount":"1000000.01"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k8", "", `{"amount":"1","amount":"2"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k9", "", `{"amount":{"amount":{"amount":[1,[2,[3]]]}}}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k10", "", "{\"amount\":\"1\x00\"}"},
		{"POST", "/api/v1/deposits", bearer | withKey, "k11", "", `{"amount":"1","extra":true}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k12", "", strings.Repeat("[", 10000)},
		{"POST", "/api/v1/deposits", bearer | withKey, "k13", "", `{"amount":"` + strings.Repeat("9", 70000) + `"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k14", "Idempotency-Key: k14", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "k15", "", `{"amount":"1","AMOUNT":"999"}`},
		{"POST", "/api/v1/submit-tokens", bearer, "", "", `{"purpoſe":"deposit"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "ключ", "", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, `""`, "", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, strings.Repeat("k", 256), "", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", bearer | withKey, "st_forged", "", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", bearer | freshToken, "", "", `{"amount":"2.50"}`},
		{"POST", "/api/v1/deposits", otherBearer | oldTok, "", "", `{"amount":"2.50"}`},
		{"POST", "/api/v1/deposits", bearer, "", "", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", withKey, "k1", "", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", cookie | withKey, "c1", "Origin: https://evil.test", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", cookie | withKey, "c2", "Content-Type: text/plain", `{"amount":"1"}`},
		{"POST", "/api/v1/deposits", cookie | withKey, "c3", "Authorization: Basic Zm9vOmJhcg==\nContent-Type: text/plain", `{"amount":"1"}`},
		{"POST", "/api/v1/withdrawals", bearer | freshToken, "", "", `{"amount":"1.00"}`},
		{"POST", "/api/v1/withdrawals", bearer | oldTok, "", "", `{"amount":"1.00"}`},
		{"POST", "/api/v1/withdrawals", bearer | freshToken, "", "", `{"amount":"999999"}`},
		{"POST", "/api/v1/withdrawals", bearer | withKey, "plain", "", `{"amount":"1"}`},
		{"POST", "/api/v1/withdrawals", bearer | freshToken, "deposit", "", `{"amount":"1"}`},
		{"POST", "/api/v1/withdrawals", otherBearer | oldTok, "", "", `{"amount":"1"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "o1", "", `{"amount":"3","description":"` + strings.Repeat("é", 201) + `"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "o2", "", `{"amount":"3","description":"\u0000\ud800"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "o3", "", `{"amount":"3","description":null}`},
		{"POST", "/api/v1/orders/{order}/payment", bearer | withKey, "p1", "", `{"method":"wallet"}`},
		{"POST", "/api/v1/orders/{order}/payment", bearer | withKey, "p2", "", `{"method":"wallet"}`},
		{"POST", "/api/v1/orders/{bigorder}/payment", bearer | withKey, "p3", "", `{"method":"wallet"}`},
		{"POST", "/api/v1/orders/{other}/payment", bearer | withKey, "p4", "", `{"method":"wallet"}`},
		{"POST", "/api/v1/orders/{order}/payment", bearer | withKey, "p5", "", `{"method":"card"}`},
		{"POST", "/api/v1/orders/{order}/payment", bearer | freshToken, "", "", `{"method":"wallet"}`},
		{"GET", "/api/v1/orders/{order}", bearer, "", "", ""},
		{"GET", "/api/v1/orders/{other}", bearer, "", "", ""},
		{"GET", "/api/v1/orders/{other}", otherBearer, "", "", ""},
		{"GET", "/api/v1/deposits/{otherdep}", bearer, "", "", ""},
		{"GET", "/api/v1/deposits/{dep}", bearer, "", "", ""},
		{"GET", "/api/v1/withdrawals/{wd}", bearer, "", "", ""},
		{"GET", "/api/v1/withdrawals/{dep}", bearer, "", "", ""},
		{"GET", "/api/v1/orders", bearer, "", "", ""},
		{"GET", "/api/v1/deposits", bearer, "", "", ""},
		{"GET", "/api/v1/withdrawals", bearer, "", "", ""},
		{"GET", "/api/v1/orders/../users", bearer, "", "", ""},
		{"POST", "/api/v1/orders/../users", 0, "", "", `{"username":"traversal","password":"long-enough"}`},
		{"GET", "/api/v1/orders/{order}/../{other}", bearer, "", "", ""},
		{"GET", "/api/v1//orders", bearer, "", "", ""},
		{"GET", "//api/v1/account", bearer, "", "", ""},
		{"GET", "/api/v1/orders/%2E%2E", bearer, "", "", ""},
		{"GET", "/api/v1/orders/{order}%2Fpayment", bearer, "", "", ""},
		{"POST", "/api/v1/orders/{order}%2Fpayment", bearer | withKey, "p6", "", `{"method":"wallet"}`},
		{"GET", "/api/v1/orders/%00", bearer, "", "", ""},
		{"GET", "/api/v1/orders/%ff%fe", bearer, "", "", ""},
		{"GET", "/api/v1/deposits/%c3%28", bearer, "", "", ""},
		{"GET", "/api/v1/withdrawals/a%00b", bearer, "", "", ""},
		{"POST", "/api/v1/orders/%00/payment", bearer | withKey, "p7", "", `{"method":"wallet"}`},
		{"POST", "/api/v1/sessions", 0, "", "", `{"username":"fuzzer\u0000","password":"x"}`},
		{"POST", "/api/v1/users", 0, "", "", `{"username":"nul_pass","password":"12345678\u0000"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "o4", "", `{"amount":"3","description":"nul\u0000"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "o5", "", `{"amount":"3","description":"ключ 🔑"}`},
		{"GET", "/api/v1/orders/" + strings.Repeat("x", 4000), bearer, "", "", ""},
		{"GET", "/API/V1/ACCOUNT", bearer, "", "", ""},
		{"DELETE", "/api/v1/account", bearer, "", "", ""},
		{"PUT", "/api/v1/deposits", bearer | withKey, "k1", "", `{"amount":"1"}`},
		{"BREW", "/api/v1/orders", bearer, "", "", ""},
		{"HEAD", "/api/v1/account", bearer, "", "", ""},
		{"OPTIONS", "/api/v1/orders", 0, "", "Origin: https://evil.test\nAccess-Control-Request-Method: POST", ""},
		{"DELETE", "/api/v1/sessions/current", bearer, "", "", ""},
		{"DELETE", "/api/v1/sessions/current", cookie, "", "", ""},
		{"GET", "/api/v1/account", bearer, "", "X-Request-Id: <script>\nX-Request-Id: ok", ""},
		{"GET", "/api/v1/account", bearer, "", "X-Long: " + strings.Repeat("v", 8000), ""},
		{"POST", "/api/v1/orders", bearer | withKey, "w1", "Idempotency-Key: w1", `{"amount":"1"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "w2", "", `{"amount":"4.00","description":"same"}`},
		{"POST", "/api/v1/orders", bearer | withKey, "w3", "", `{"description":"same","amount":4}`},
	} {
		f.Add(s.method, s.path, s.mode, s.key, s.headers, []byte(s.body))
	}
}

func (hs *routerHarness) fuzz(t *testing.T, method, path string, mode uint8, key, headers string, body []byte) {
	for ph, id := range hs.ids {
		path = strings.ReplaceAll(path, ph, id)
	}
	authMode, keyMode := mode&3, (mode>>2)&3
	var head strings.Builder
	head.WriteString(method + " " + path + " HTTP/1.1\r\nHost: onceguard.test\r\n")
	as := fuzzUser{}
	switch authMode {
	case 1:
		as = hs.me
		head.WriteString("Authorization: Bearer " + hs.me.token + "\r\n")
	case 2:
		as = hs.me
		head.WriteString("Cookie: " + httpapi.SessionCookie + "=" + hs.me.token + "\r\n")
		if !strings.Contains(strings.ToLower(headers), "content-type:") {
			head.WriteString("Content-Type: application/json\r\n")
		}
	case 3:
		as = hs.him
		head.WriteString("Authorization: Bearer " + hs.him.token + "\r\n")
	}
	switch keyMode {
	case 1:
		head.WriteString("Idempotency-Key: " + key + "\r\n")
	case 2:
		if code, out := hs.call(t, hs.me, "POST", "/api/v1/submit-tokens", "", `{"purpose":"`+purposeOf(key, path)+`"}`); code == http.StatusCreated {
			hs.last = out["token"]
		} else {
			t.Fatalf("minting a submit token: %d %v", code, out)
		}
		fallthrough
	case 3:
		head.WriteString("Idempotency-Key: " + hs.last + "\r\n")
	}
	for _, l := range strings.Split(headers, "\n") {
		l = strings.TrimSuffix(l, "\r")
		name, _, _ := strings.Cut(l, ":")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "", "host", "content-length", "transfer-encoding":
			continue // the framing is the test's
		}
		head.WriteString(l + "\r\n")
	}
	head.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	raw := append([]byte(head.String()), body...)
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return // net/http would have refused it before the service
	}
	r.RemoteAddr = "192.0.2.1:4321"
	shown := raw
	if len(shown) > 1500 {
		shown = shown[:1500]
	}
	what := fmt.Sprintf("%s %.300q (mode %d, as %q)\nrequest (%d bytes): %q", r.Method, r.RequestURI, mode, as.name, len(raw), shown)
	w := httptest.NewRecorder()
	hs.h.ServeHTTP(w, r) // a panic fails the fuzz target
	t.Logf("%s %s (mode %d) -> %d %.200s", r.Method, r.RequestURI, mode, w.Code, w.Body.Bytes())
	hs.checkAnswer(t, what, r, body, w, as, authMode == 2)
	if w.Code == http.StatusNoContent && r.Method == http.MethodDelete && r.URL.Path == "/api/v1/sessions/current" && as.token != "" {
		// Signed out: the token must stop working at once. A new session
		// lets the next inputs reach the signed-in routes.
		if code, _ := hs.call(t, as, "GET", "/api/v1/account", "", ""); code != http.StatusUnauthorized {
			t.Fatalf("%s\nsigned out, the old token still gets %d; want 401", what, code)
		}
		if as.id == hs.me.id {
			hs.me = hs.newSession(t, hs.me)
		} else {
			hs.him = hs.newSession(t, hs.him)
		}
	}
	hs.checkBooks(t)
}

// tolerateBadTextOnPostgres: KNOWN BUG, reported, not fixed yet. On
// PostgreSQL a NUL or invalid UTF-8 in a path id (GET
// /api/v1/orders/%00, /api/v1/deposits/%c3%28, POST
// /api/v1/orders/%00/payment) or a NUL in a JSON string that reaches a
// query (a username at POST /api/v1/sessions, an order's description:
// "\u0000") makes the query fail and the service answer 500 internal;
// SQLite and MySQL answer 404 / 401 / 201. The contract wants 4xx for bad
// input. Set this to false once such input is refused (or found absent)
// before it reaches PostgreSQL.
const tolerateBadTextOnPostgres = false

// badText reports whether path or the JSON body holds a NUL or invalid
// UTF-8, which PostgreSQL text cannot.
func badText(path string, body []byte) bool {
	return strings.ContainsRune(path, 0) || !utf8.ValidString(path) || bytes.Contains(body, []byte(`\u0000`))
}

func (hs *routerHarness) checkAnswer(t *testing.T, what string, r *http.Request, reqBody []byte, w *httptest.ResponseRecorder, as fuzzUser, byCookie bool) {
	t.Helper()
	status, hdr, body := w.Code, w.Header(), w.Body.Bytes()
	fail := func(format string, args ...any) {
		t.Helper()
		b := body
		if len(b) > 500 {
			b = b[:500]
		}
		t.Fatalf("%s\nanswer: %d %v %s\n%s", what, status, hdr, b, fmt.Sprintf(format, args...))
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	if status >= 400 {
		if ct := hdr.Get("Content-Type"); ct != "application/problem+json" {
			fail("an error with Content-Type %q; want application/problem+json", ct)
		}
		if err := json.Unmarshal(body, &p); err != nil {
			fail("problem body: %v", err)
		}
		if !codeRE.MatchString(p.Code) || p.Status != status || p.Type == "" || p.Title == "" {
			fail("problem %+v; want a snake_case code, its status, a type and a title", p)
		}
	}
	switch {
	case status == http.StatusInternalServerError && tolerateBadTextOnPostgres && hs.dialect == sqldialect.Postgres && badText(r.URL.Path, reqBody):
		return // the known, reported bug: see tolerateBadTextOnPostgres
	case status == http.StatusInternalServerError:
		fail("500: a bug")
	case status == http.StatusServiceUnavailable:
		if hdr.Get("Retry-After") == "" {
			fail("503 without Retry-After")
		}
	case status >= 500:
		fail("%d: want no 5xx but 503 with a code", status)
	case status == http.StatusNotFound && p.Code != "not_found",
		status == http.StatusMethodNotAllowed && (p.Code != "method_not_allowed" || hdr.Get("Allow") == ""),
		status == http.StatusRequestEntityTooLarge && p.Code != "body_too_large":
		fail("status %d with code %q (Allow %q)", status, p.Code, hdr.Get("Allow"))
	case status == http.StatusTooManyRequests && p.Code == "duplicate_submission",
		status == http.StatusConflict && (p.Code == "request_in_progress" || p.Code == "payment_in_progress"):
		if hdr.Get("Retry-After") == "" {
			fail("%s without Retry-After", p.Code)
		}
	}
	if ra := hdr.Get("Retry-After"); ra != "" {
		if n, err := strconv.Atoi(ra); err != nil || n < 1 || n > 86400 || strconv.Itoa(n) != ra {
			fail("Retry-After %q; want whole seconds", ra)
		}
	}
	if strings.HasPrefix(r.URL.Path, "/api/") && hdr.Get("Cache-Control") != "no-store" {
		fail("Cache-Control %q on an API answer; want no-store", hdr.Get("Cache-Control"))
	}
	if id := hdr.Get("X-Request-Id"); !reqIDRE.MatchString(id) {
		fail("X-Request-Id %q", id)
	}
	if hdr.Get("Idempotent-Replayed") == "true" && len(hdr.Values("Set-Cookie")) > 0 {
		fail("a replay sets a cookie")
	}
	if status/100 == 2 && strings.HasPrefix(hdr.Get("Content-Type"), "application/json") && r.Method != http.MethodHead {
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			fail("a JSON answer that is not JSON: %v", err)
		}
		if bad := moneyFields(v); bad != "" {
			fail("money field %s; want a string with two decimals", bad)
		}
	}
	// A state change made on the strength of the session cookie came
	// from this origin and sent JSON (or was a DELETE without a body).
	if byCookie && status/100 == 2 && r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions &&
		r.URL.Path != "/api/v1/users" && r.URL.Path != "/api/v1/sessions" && !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") &&
		!(httpapi.TolerateNonBearerAuthorization && r.Header.Get("Authorization") != "") { // else the known, reported bug: see httpapi.TolerateNonBearerAuthorization
		site, origin := r.Header.Get("Sec-Fetch-Site"), r.Header.Get("Origin")
		sameOrigin := site == "" || site == "same-origin" || site == "none"
		if u, err := url.Parse(origin); origin != "" && (err != nil || u.Host != r.Host) {
			sameOrigin = false
		}
		if !sameOrigin || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") && !(r.Method == http.MethodDelete && r.ContentLength == 0) {
			fail("a cross-site or non-JSON request changed state with the session cookie")
		}
	}
	// A movement or an order is made for exactly the amount the body's
	// "amount" member says.
	if status == http.StatusCreated && r.Method == http.MethodPost && (r.URL.Path == "/api/v1/deposits" || r.URL.Path == "/api/v1/withdrawals" || r.URL.Path == "/api/v1/orders") {
		var in map[string]json.RawMessage
		var out struct{ Amount string }
		if err := json.Unmarshal(reqBody, &in); err != nil {
			fail("201 for a body that is not a JSON object: %v", err)
		}
		_ = json.Unmarshal(body, &out)
		folded := false
		for k := range in {
			folded = folded || k != "amount" && strings.EqualFold(k, "amount")
		}
		if !(folded && tolerateCaseFoldedMembers) { // else the known, reported bug: see tolerateCaseFoldedMembers
			a, err := money.FromJSON(in["amount"])
			if err != nil || a.String() != out.Amount {
				fail("201 for amount %s; the body's \"amount\" is %s", out.Amount, in["amount"])
			}
		}
	}
	// Nothing of the other user reaches the fuzz user, or anyone else.
	if as.id != hs.him.id {
		for _, secret := range []string{hs.him.id, hs.ids["{other}"], hs.ids["{otherdep}"], hs.him.token} {
			if bytes.Contains(body, []byte(secret)) {
				fail("the answer holds the other user's %q", secret)
			}
		}
		if status/100 == 2 && (strings.Contains(r.URL.Path, hs.ids["{other}"]) || strings.Contains(r.URL.Path, hs.ids["{otherdep}"])) {
			fail("the other user's resource was served")
		}
	}
	if bytes.Contains(body, []byte(fuzzPassword)) {
		fail("the answer holds a password")
	}
}
