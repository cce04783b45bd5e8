package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
	"github.com/onceguard/onceguard/token"
)

// A form that submits again takes its next one-time token from the answer
// (idempotency.Options.OfferToken) instead of asking for one first: signed
// tokens, whose minting writes nothing, bound by the key's record in the
// SQL store. A replay carries no new token.
func Example_offerToken() {
	dir, _ := os.MkdirTemp("", "offer")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)")
	defer db.Close()
	store, err := sqlstore.New(db, sqldialect.SQLite, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Migrate(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	tokens := token.New(store, &token.Options{Key: []byte("a secret of 32 bytes or more, shared")})
	h := idempotency.Middleware(idempotency.Config{
		Store: store, Tokens: tokens, Purpose: "withdrawal", RequireToken: true, OfferToken: true,
		Principal: func(r *http.Request) (string, error) { return "alice", nil },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	post := func(key, body string) *http.Response {
		r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}

	// No token yet: the refusal brings one.
	resp := post("a-plain-key", `{"amount":1}`)
	next := resp.Header.Get("Next-Submit-Token")
	fmt.Println(resp.StatusCode, token.IsToken(next))
	var key string
	for _, amount := range []string{"1", "2"} {
		key = next
		resp = post(key, `{"amount":`+amount+`}`)
		next = resp.Header.Get("Next-Submit-Token")
		fmt.Println(resp.StatusCode, token.IsToken(next), next != key)
	}
	// A retry of the last request is its replay, with nothing new.
	resp = post(key, `{"amount":2}`)
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("Next-Submit-Token") == "")
	// Output:
	// 400 true
	// 201 true true
	// 201 true true
	// 201 true true
}
