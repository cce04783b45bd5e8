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

// A Guard serves any transport: here a minimal adapter for a framework
// whose handlers take a request and return status and body (as an RPC
// framework's do). Begin runs the checks, the handler runs only for a new
// key, Finish stores its answer.
func ExampleGuard() {
	type req struct{ user, key, body string }
	g := idempotency.NewGuard(idempotency.Options[*req]{
		Store:     &memstore.Store{},
		Principal: func(r *req) (string, error) { return r.user, nil },
	})
	handler := func(ctx context.Context, r *req) (int, []byte) {
		return 201, []byte(`{"charged":` + r.body + `}`)
	}
	serve := func(r *req) string {
		out := g.Begin(context.Background(), r, &idempotency.Request{Method: "POST", Path: "/charges", Key: []string{r.key}, Body: []byte(r.body)})
		switch {
		case out.Problem != nil:
			return fmt.Sprint(out.Problem.Status, " ", out.Problem.Code)
		case out.Replay != nil:
			return fmt.Sprint(out.Replay.Status, " ", string(out.Replay.Body), " (replayed)")
		}
		status, body := handler(out.Call.Context(), r) // a panic here: g.Abort, then re-panic
		if p := g.Finish(r, out.Call, idempotency.Answer{Status: status, Body: body, Written: true}); p != nil {
			return fmt.Sprint(p.Status, " ", p.Code)
		}
		return fmt.Sprint(status, " ", string(body))
	}
	fmt.Println(serve(&req{"ann", "k1", `{"amount":5}`}))
	fmt.Println(serve(&req{"ann", "k1", `{"amount":5}`}))
	fmt.Println(serve(&req{"ann", "k1", `{"amount":6}`}))
	fmt.Println(serve(&req{"ann", "", `{"amount":6}`}))
	// Output:
	// 201 {"charged":{"amount":5}}
	// 201 {"charged":{"amount":5}} (replayed)
	// 422 idempotency_key_reused
	// 400 idempotency_key_missing
}

// KeyField takes the key from a form field, as a plain HTML form sends
// it; the field's value works as Idempotency-Key would.
func ExampleConfig_keyField() {
	runs := 0
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, KeyField: "withdraw_token",
		Fingerprint: func(_ *http.Request, body []byte) (string, error) { return string(body), nil }})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++; w.WriteHeader(http.StatusCreated) }))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/withdraw", strings.NewReader("amount=10&withdraw_token=f3a9c1"))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, "replayed="+w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 replayed=
	// 201 replayed=true
	// handler runs: 1
}
