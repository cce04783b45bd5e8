package idemclient_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemclient"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// One key per intent: the caller mints it once and keeps it, so a retry
// after a lost answer, here sent by hand, gets the stored answer and the
// payout runs once.
func ExampleTransport() {
	payouts := 0
	srv := httptest.NewServer(idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			payouts++
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "payout %d\n", payouts)
		})))
	defer srv.Close()

	client := &http.Client{Transport: &idemclient.Transport{}}
	key := idemclient.NewKey() // one per intent, kept across retries
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payouts", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemclient.Header, key)
		resp, err := client.Do(req)
		if err != nil {
			// The outcome is unknown: retry later with the same key.
			fmt.Println("retry later with", err.(*idemclient.Error).Key == key)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%v %s", resp.StatusCode, idemclient.Replayed(resp), body)
	}
	fmt.Println("payouts made:", payouts)
	// Output:
	// 201 replayed=false payout 1
	// 201 replayed=true payout 1
	// payouts made: 1
}

// Against a server that offers the next submit token with each answer
// (idempotency.Config.OfferToken), Offers sends each offer as the key of
// the next request to the route: three withdrawals, one token minted.
func ExampleOffers() {
	store := &memstore.Store{}
	tokens := token.New(store, &token.Options{Key: []byte("a secret of 32 bytes or more, shared by all")})
	srv := httptest.NewServer(idempotency.Middleware(idempotency.Config{
		Store: store, Tokens: tokens, Purpose: "withdrawal", RequireToken: true, OfferToken: true,
		Principal: func(r *http.Request) (string, error) { return "alice", nil },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })))
	defer srv.Close()

	mints := 0
	client := &http.Client{Transport: &idemclient.Transport{
		Offers: &idemclient.Offers{}, // one per signed-in user
		NewKey: func(r *http.Request) (string, error) { // in a real client: POST the service's mint route
			mints++
			is, err := tokens.Issue(r.Context(), "alice", "withdrawal")
			return is.Token, err
		},
	}}
	for _, amount := range []string{"1", "2", "3"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/withdrawals", strings.NewReader(`{"amount":`+amount+`}`))
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, strings.HasPrefix(idemclient.Key(resp), "st_"))
	}
	fmt.Println("tokens minted:", mints)
	// Output:
	// 201 true
	// 201 true
	// 201 true
	// tokens minted: 1
}
