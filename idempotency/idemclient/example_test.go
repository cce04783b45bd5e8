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
