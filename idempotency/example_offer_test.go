package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// A form that submits again takes its next one-time token from the answer
// (OfferToken) instead of asking for one first: signed tokens, whose
// minting writes nothing, each bound by the key's record it creates. A
// refusal brings one too; a replay carries none.
func ExampleConfig_offerToken() {
	store := &memstore.Store{}
	tokens := token.New(store, &token.Options{Key: []byte("a secret of 32 bytes or more, shared by all")})
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
	next := resp.Header.Get(idempotency.HeaderNextToken)
	fmt.Println(resp.StatusCode, token.IsToken(next))
	var key string
	for _, amount := range []string{"1", "2"} {
		key = next
		resp = post(key, `{"amount":`+amount+`}`)
		next = resp.Header.Get(idempotency.HeaderNextToken)
		fmt.Println(resp.StatusCode, token.IsToken(next), next != key)
	}
	// A retry of the last request is its replay, with nothing new.
	resp = post(key, `{"amount":2}`)
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get(idempotency.HeaderNextToken) == "")
	// Output:
	// 400 true
	// 201 true true
	// 201 true true
	// 201 true true
}
