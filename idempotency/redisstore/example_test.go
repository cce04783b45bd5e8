package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/token"
)

// authenticate stands in for the application's session lookup: the user
// id, or an error that Middleware answers 401.
func authenticate(r *http.Request) (string, error) {
	return "", errors.New("not signed in")
}

// One Store on your go-redis client keeps the keys' records, the submit
// tokens and the repeat-submit window of the Idempotency-Key middleware.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}) // or a ClusterClient, or Sentinel
	defer rdb.Close()
	store := redisstore.New(rdb, &redisstore.Options{Prefix: "shop:idem:"})

	tokens := token.New(store, nil) // tokens.Issue(ctx, userID, "withdrawal") for each form shown
	guard := idempotency.Middleware(idempotency.Config{
		Store: store, Tokens: tokens, Purpose: "withdrawal", RequireToken: true,
		Windows: store, Window: 10 * time.Second,
		Principal: authenticate,
	})
	withdraw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated) // runs once per key; retries get this answer replayed
	})

	mux := http.NewServeMux()
	mux.Handle("POST /withdrawals", guard(withdraw))
	if err := http.ListenAndServe("127.0.0.1:8080", mux); err != nil {
		fmt.Println(err)
	}
}

// A queue consumer whose records live in Redis: each message runs once,
// however often it is delivered.
func Example_consumer() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	store := redisstore.New(rdb, nil)

	ctx := context.Background()
	scope := idempotency.Scope{Principal: "billing-worker", Method: "invoice.send"}
	msgID, body := "msg-42", `{"invoice":42}`
	fp, _ := idempotency.Fingerprint([]byte(body))
	res, replayed, err := idempotency.Do(ctx, store, scope, msgID, fp, nil, func(ctx context.Context) ([]byte, error) {
		return []byte("invoice 42 sent"), nil // the work; ctx ends before the lease does
	})
	switch {
	case errors.Is(err, idempotency.ErrInProgress):
		fmt.Println("another delivery is running it: redeliver later")
	case errors.Is(err, idempotency.ErrMismatch):
		fmt.Println("message id reused for another body: drop it")
	case errors.Is(err, idempotency.ErrUnavailable):
		fmt.Println("Redis does not answer: redeliver later")
	case err != nil:
		fmt.Println("failed, redeliver:", err)
	default:
		fmt.Println(string(res), "replayed:", replayed)
	}
}
