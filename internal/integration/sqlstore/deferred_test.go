package sqlstore_test

import (
	"context"
	"database/sql"
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
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
	"github.com/onceguard/onceguard/token"
)

// deferredRig is Middleware with Options.Deferred on a SQL store, in front
// of a handler that creates the key's record in the transaction of its
// effect (a row of table), with StartTx, or on PostgreSQL in one
// statement with StartCTE.
type deferredRig struct {
	s      *sqlstore.Store
	db     *sql.DB
	table  string
	h, raw http.Handler
	tokens *token.Tokens
	later  atomic.Int64 // the tokens' clock is this far ahead
	d      sqldialect.Dialect
	// rollback, when set, makes the handler roll back after creating the
	// record and its effect (composed: makes its effect fail in the same
	// statement), and answer 503 without Created.
	rollback bool
}

func newDeferredRig(t *testing.T, d database, composed bool) *deferredRig {
	return newRig(t, d, composed, true, nil)
}

// newRig is a deferredRig, Deferred or not, its tokens signed with key
// (nil: stored).
func newRig(t *testing.T, d database, composed, deferred bool, key []byte) *deferredRig {
	t.Helper()
	s, db := d.store(t)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rig := &deferredRig{s: s, db: db, table: fmt.Sprintf("deferred_%d", time.Now().UnixNano()), d: d.dialect}
	rig.tokens = token.New(s, &token.Options{Key: key, Now: func() time.Time { return time.Now().Add(time.Duration(rig.later.Load())) }})
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+rig.table+` (k VARCHAR(200))`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + rig.table) })
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call, _ := idempotency.FromContext(r.Context())
		var err error
		if composed && call.Start() != nil {
			err = rig.composed(r.Context(), call)
		} else {
			err = rig.inTx(r.Context(), call)
		}
		if call.Refused(err) {
			return // the middleware answers
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q}`, call.Key)
	})
	rig.raw = handler
	rig.h = idempotency.Middleware(idempotency.Config{
		Store: s, Deferred: deferred, Tokens: rig.tokens, Purpose: "pay", Window: time.Minute,
		Principal: func(r *http.Request) (string, error) { return "alice", nil },
	})(handler)
	return rig
}

// inTx creates the record and the effect in one transaction.
func (rig *deferredRig) inTx(ctx context.Context, call *idempotency.Call) error {
	tx, err := rig.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := rig.s.StartTx(ctx, tx, call.Start()); err != nil {
		return err
	}
	q := `INSERT INTO ` + rig.table + ` (k) VALUES (?)`
	if rig.d == sqldialect.Postgres {
		q = `INSERT INTO ` + rig.table + ` (k) VALUES ($1)`
	}
	if _, err := tx.ExecContext(ctx, q, call.Key); err != nil {
		return err
	}
	if rig.rollback {
		return errors.New("rolled back")
	}
	err = tx.Commit()
	call.Created() // committed, or perhaps: its answer is the record's
	return err
}

// composed creates the record and the effect in one autocommitted statement.
func (rig *deferredRig) composed(ctx context.Context, call *idempotency.Call) error {
	cte, err := rig.s.StartCTE(call.Start(), 2, "")
	if err != nil {
		return err
	}
	value := `$1`
	if rig.rollback { // the effect fails after the record's part: the statement commits neither
		value = `CAST($1 AS int)::text`
	}
	var created int64
	err = rig.db.QueryRowContext(ctx, `WITH `+cte.With+`, eff AS (
  INSERT INTO `+rig.table+` (k) SELECT `+value+` WHERE `+cte.Started+`
) SELECT `+cte.Result, append([]any{call.Key}, cte.Args...)...).Scan(&created)
	if err := rig.s.Started(ctx, call.Start(), created, err); err != nil {
		return err
	}
	call.Created()
	return nil
}

func (rig *deferredRig) post(t *testing.T, path, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	rig.h.ServeHTTP(w, r)
	return w
}

func (rig *deferredRig) effects(t *testing.T, key string) (n int) {
	t.Helper()
	q := `SELECT COUNT(*) FROM ` + rig.table + ` WHERE k = ?`
	if rig.d == sqldialect.Postgres {
		q = `SELECT COUNT(*) FROM ` + rig.table + ` WHERE k = $1`
	}
	if err := rig.db.QueryRow(q, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (rig *deferredRig) record(t *testing.T, path, key string) (idemstore.Record, bool) {
	t.Helper()
	rec, err := rig.s.Inspect(context.Background(), idempotency.RecordID(idempotency.Scope{Principal: "alice", Method: http.MethodPost, Path: path}, key))
	if errors.Is(err, sqlstore.ErrNoRecord) {
		return rec, false
	} else if err != nil {
		t.Fatal(err)
	}
	return rec, true
}

// Deferred: the key's record is created only with its effect, in one
// transaction (StartTx, every dialect) or one statement (StartCTE,
// PostgreSQL), and every answer the Guard gives before a handler without
// Deferred still comes: a replay, 422 for another body, 409 or a replay for
// a storm of the same key (one effect), 429 for the same body under a new
// key (no record left for it), 400 for a token used elsewhere. A handler
// that rolls back leaves no record, and its retry runs.
func TestDeferred(t *testing.T) {
	for _, d := range databases {
		for _, composed := range []bool{false, true} {
			if composed && d.dialect != sqldialect.Postgres {
				continue
			}
			name := d.name + "/tx"
			if composed {
				name = d.name + "/cte"
			}
			t.Run(name, func(t *testing.T) {
				rig := newDeferredRig(t, d, composed)
				n := time.Now().UnixNano()
				key, path := fmt.Sprint("k-", n), fmt.Sprint("/pay/", n)

				// Rolled back: no record, no effect; the retry runs.
				rig.rollback = true
				if w := rig.post(t, path, key, `{"amount":1}`); w.Code != 503 {
					t.Fatalf("rolled back = %d %s; want 503", w.Code, w.Body)
				}
				if _, ok := rig.record(t, path, key); ok || rig.effects(t, key) != 0 {
					t.Fatalf("after a rollback: record %v, %d effects; want neither", ok, rig.effects(t, key))
				}
				rig.rollback = false

				first := rig.post(t, path, key, `{"amount":1}`)
				if first.Code != 201 || first.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("first = %d %s %v; want 201, not replayed", first.Code, first.Body, first.Header())
				}
				if rec, ok := rig.record(t, path, key); !ok || rec.State != idemstore.Completed || rec.Response.Status != 201 {
					t.Fatalf("record after the first = %+v, %v; want completed with 201", rec, ok)
				}
				again := rig.post(t, path, key, `{"amount":1}`)
				if again.Code != 201 || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
					t.Fatalf("retry = %d %s %v; want the first answer replayed", again.Code, again.Body, again.Header())
				}
				if w := rig.post(t, path, key, `{"amount":2}`); w.Code != 422 {
					t.Fatalf("another body under the key = %d; want 422", w.Code)
				}

				// The same body under a new key, within the window: 429, and
				// no record for that key (its statement or transaction
				// rolled back), so the key stays usable.
				dup := fmt.Sprint("dup-", n)
				if w := rig.post(t, path, dup, `{"amount":1}`); w.Code != 429 || w.Header().Get("Retry-After") == "" {
					t.Fatalf("the same body under a new key = %d %v; want 429 with Retry-After", w.Code, w.Header())
				}
				if _, ok := rig.record(t, path, dup); ok || rig.effects(t, dup) != 0 {
					t.Fatalf("after the 429: record %v, %d effects; want neither", ok, rig.effects(t, dup))
				}

				// A storm of one new key: one effect; every answer the first's, or 409.
				storm := fmt.Sprint("storm-", n)
				var wg sync.WaitGroup
				codes := make([]int, 24)
				for i := range codes {
					wg.Add(1)
					go func() {
						defer wg.Done()
						codes[i] = rig.post(t, path, storm, `{"amount":3}`).Code
					}()
				}
				wg.Wait()
				if e := rig.effects(t, storm); e != 1 {
					t.Fatalf("storm of one key: %d effects (answers %v); want 1", e, codes)
				}
				for _, c := range codes {
					if c != 201 && c != 409 {
						t.Fatalf("storm answers %v; want 201 or 409 only", codes)
					}
				}

				// A submit token: bound with the record; another path is 400.
				issued, err := rig.tokens.Issue(context.Background(), "alice", "pay")
				if err != nil {
					t.Fatal(err)
				}
				tok := issued.Token
				if w := rig.post(t, path+"/t", tok, `{"amount":4}`); w.Code != 201 {
					t.Fatalf("with a submit token = %d %s; want 201", w.Code, w.Body)
				}
				if w := rig.post(t, path+"/other", tok, `{"amount":5}`); w.Code != 400 || !strings.Contains(w.Body.String(), "submit_token_invalid") {
					t.Fatalf("the token on another path = %d %s; want 400 submit_token_invalid", w.Code, w.Body)
				}
				if e := rig.effects(t, tok); e != 1 {
					t.Fatalf("token: %d effects; want 1", e)
				}
			})
		}
	}
}

// Signed submit tokens on the SQL store, Deferred (in one transaction or,
// on PostgreSQL, one statement) and not: minted with no write, bound by
// the record they create. The token's retry replays; on another path it is
// 400 (used), as it is for another user (foreign) or when forged; of ten
// first uses on ten paths at once, one runs.
func TestSignedTokens(t *testing.T) {
	signedRigs(t, func(t *testing.T, rig *deferredRig, mode string) {
		n := time.Now().UnixNano()
		path := fmt.Sprint("/signed/", n)
		issued, err := rig.tokens.Issue(context.Background(), "alice", "pay")
		if err != nil {
			t.Fatal(err)
		}
		tok := issued.Token
		// Expired before its first use: refused, nothing made.
		late := token.New(rig.s, &token.Options{Key: signedKey, TTL: time.Minute, Now: func() time.Time { return time.Now().Add(-2 * time.Minute) }})
		old, _ := late.Issue(context.Background(), "alice", "pay")
		if w := rig.post(t, path+"/old", old.Token, `{"amount":9}`); w.Code != 400 || rig.effects(t, old.Token) != 0 {
			t.Fatalf("an expired token = %d, %d effects; want 400, none", w.Code, rig.effects(t, old.Token))
		}
		first := rig.post(t, path+"/a", tok, `{"amount":1}`)
		if first.Code != 201 {
			t.Fatalf("first use = %d %s; want 201", first.Code, first.Body)
		}
		if w := rig.post(t, path+"/a", tok, `{"amount":1}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("its retry = %d %v; want the replay", w.Code, w.Header())
		}
		for _, c := range []struct{ name, path, key string }{
			{"on another path", path + "/b", tok},
			{"forged", path + "/c", tok[:len(tok)-2] + "AA"},
		} {
			if w := rig.post(t, c.path, c.key, `{"amount":2}`); w.Code != 400 || !strings.Contains(w.Body.String(), "submit_token_invalid") {
				t.Fatalf("the token %s = %d %s; want 400 submit_token_invalid", c.name, w.Code, w.Body)
			}
		}
		bobs, _ := rig.tokens.Issue(context.Background(), "bob", "pay")
		if w := rig.post(t, path+"/d", bobs.Token, `{"amount":3}`); w.Code != 400 {
			t.Fatalf("bob's token = %d; want 400", w.Code)
		}
		if e := rig.effects(t, tok); e != 1 {
			t.Fatalf("%d effects of the token; want 1", e)
		}
		// Past its TTL, its request's retry is still its record's replay.
		rig.later.Store(int64(time.Hour))
		if w := rig.post(t, path+"/a", tok, `{"amount":1}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("its retry after its TTL = %d %s; want the replay", w.Code, w.Body)
		}
		rig.later.Store(0)

		// Ten first uses of one token on ten paths at once: one runs.
		issued, _ = rig.tokens.Issue(context.Background(), "alice", "pay")
		var wg sync.WaitGroup
		codes := make([]int, 10)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := rig.post(t, fmt.Sprint(path, "/r", i), issued.Token, fmt.Sprintf(`{"amount":%d}`, 10+i))
				codes[i] = w.Code
				if w.Code == 503 {
					t.Log(w.Body.String())
				}
			}()
		}
		wg.Wait()
		ok := 0
		for _, c := range codes {
			switch c {
			case 201:
				ok++
			case 400, 409:
			default:
				t.Fatalf("race answers %v; want 201, 400 or 409", codes)
			}
		}
		if e := rig.effects(t, issued.Token); ok != 1 || e != 1 {
			t.Fatalf("race: %d answered 201, %d effects (answers %v); want 1 and 1", ok, e, codes)
		}
	})
}

// OfferToken with signed tokens on the SQL store, Deferred (one
// transaction, or on PostgreSQL one statement) and not: each answer of a
// token-keyed request carries the next token, added after the answer is
// stored (a replay has none though every header is replayed), and on the
// Guard's own refusals that Deferred answers after the handler refused
// (Resume): the used token's 400 and the window's 429.
func TestOfferTokenDeferred(t *testing.T) {
	signedRigs(t, func(t *testing.T, rig *deferredRig, mode string) {
		var offered atomic.Int32
		rig.h = idempotency.Middleware(idempotency.Config{
			Store: rig.s, Deferred: mode != "begin", Tokens: rig.tokens, Purpose: "pay", Window: time.Minute,
			OfferToken: true, ReplayHeaders: []string{"*"},
			Principal: func(r *http.Request) (string, error) { return "alice", nil },
			OnEvent: func(_ *http.Request, ev string) {
				if ev == "token_offered" {
					offered.Add(1)
				}
			},
		})(rig.raw)
		next := func(what string, w *httptest.ResponseRecorder) string {
			t.Helper()
			tok := w.Header().Get(idempotency.HeaderNextToken)
			if err := rig.tokens.Verify(tok, "alice", "pay"); err != nil || w.Header().Get(idempotency.HeaderNextTokenExpires) == "" {
				t.Fatalf("%s = %d %s %v: the offer %q does not verify (%v)", what, w.Code, w.Body, w.Header(), tok, err)
			}
			return tok
		}
		n := time.Now().UnixNano()
		path := fmt.Sprint("/offer/", n)
		issued, err := rig.tokens.Issue(context.Background(), "alice", "pay")
		if err != nil {
			t.Fatal(err)
		}
		first := rig.post(t, path+"/a", issued.Token, `{"amount":1}`)
		if first.Code != 201 {
			t.Fatalf("first use = %d %s; want 201", first.Code, first.Body)
		}
		tok2 := next("the first answer", first)
		replay := rig.post(t, path+"/a", issued.Token, `{"amount":1}`)
		if replay.Header().Get("Idempotent-Replayed") != "true" || replay.Header().Get(idempotency.HeaderNextToken) != "" {
			t.Fatalf("its retry = %d %v; want the replay, with no token (none was stored)", replay.Code, replay.Header())
		}
		if w := rig.post(t, path+"/b", tok2, `{"amount":2}`); w.Code != 201 {
			t.Fatalf("the offered token = %d %s; want 201", w.Code, w.Body)
		}
		used := rig.post(t, path+"/c", tok2, `{"amount":3}`)
		if used.Code != 400 || !strings.Contains(used.Body.String(), "submit_token_invalid") {
			t.Fatalf("the offered token used again elsewhere = %d %s; want 400 submit_token_invalid", used.Code, used.Body)
		}
		tok3 := next("the used token's 400", used)
		dup := rig.post(t, path+"/b", tok3, `{"amount":2}`)
		if dup.Code != 429 {
			t.Fatalf("the same body under the next token = %d %s; want 429", dup.Code, dup.Body)
		}
		next("the 429", dup)
		if w := rig.post(t, path+"/d", tok3, `{"amount":4}`); w.Code != 201 {
			t.Fatalf("the 400's offer = %d %s; want 201 (the 429 left it unused)", w.Code, w.Body)
		}
		if e1, e2, e3 := rig.effects(t, issued.Token), rig.effects(t, tok2), rig.effects(t, tok3); e1 != 1 || e2 != 1 || e3 != 1 {
			t.Fatalf("effects %d %d %d; want one each", e1, e2, e3)
		}
		if got := offered.Load(); got != 5 {
			t.Errorf("told token_offered %d times; want 5", got)
		}
	})
}

// signedKey signs the rigs' tokens.
var signedKey = []byte("0123456789abcdef0123456789abcdef")

// signedRigs runs f on a rig with signed tokens on every database, in each
// mode: "begin" (no Deferred), "tx" (Deferred, the record in the effect's
// transaction) and, on PostgreSQL, "cte" (in its statement).
func signedRigs(t *testing.T, f func(t *testing.T, rig *deferredRig, mode string)) {
	for _, d := range databases {
		for _, mode := range []string{"begin", "tx", "cte"} {
			if mode == "cte" && d.dialect != sqldialect.Postgres {
				continue
			}
			t.Run(d.name+"/"+mode, func(t *testing.T) { f(t, newRig(t, d, mode == "cte", mode != "begin", signedKey), mode) })
		}
	}
}
