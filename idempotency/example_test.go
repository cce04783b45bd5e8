package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// handler runs once.
func ExampleMiddleware_replay() {
	runs := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment_id":"p%d"}`, runs)
	})
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(pay)

	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
		r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body.String(), "replayed="+w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"payment_id":"p1"} replayed=
	// 201 {"payment_id":"p1"} replayed=true
	// handler runs: 1
}

// Do runs a job once per message key, however often the message arrives.
func ExampleDo() {
	store := &memstore.Store{}
	scope := idempotency.Scope{Principal: "billing-worker", Method: "invoice.send"}
	send := func(ctx context.Context) ([]byte, error) {
		fmt.Println("sending invoice 42")
		return []byte("sent"), nil
	}
	for range 3 { // the queue delivered it three times
		res, replayed, err := idempotency.Do(context.Background(), store, scope, "invoice-42", "v1", nil, send)
		fmt.Println(string(res), replayed, err)
	}
	_, _, err := idempotency.Do(context.Background(), store, scope, "invoice-42", "v2", nil, send)
	fmt.Println(errors.Is(err, idempotency.ErrMismatch))
	// Output:
	// sending invoice 42
	// sent false <nil>
	// sent true <nil>
	// sent true <nil>
	// true
}
