package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/webhook"
)

// A provider's callback endpoint: package webhook checks the signature,
// Once acts on each event id once. The provider delivers the same event
// three times; the account is credited once, and every delivery is
// answered 204 so that the provider stops retrying.
func ExampleOnce() {
	secret := []byte("whsec_from_the_provider")
	store := &memstore.Store{}
	balance := 0

	notify := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev struct {
			ID     string `json:"id"`
			Amount int    `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.ID == "" {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		_, err := idempotency.Once(r.Context(), store, "psp", ev.ID, nil, func(ctx context.Context) error {
			balance += ev.Amount // the effect: on SQL, use sqlstore.Store.OnceTx
			return nil
		})
		switch {
		case errors.Is(err, idempotency.ErrInProgress): // another delivery is at it
			w.Header().Set("Retry-After", "1")
			http.Error(w, "in progress", http.StatusServiceUnavailable)
		case err != nil: // fn failed: the provider retries
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		default: // done now, or done before
			w.WriteHeader(http.StatusNoContent)
		}
	})
	h := webhook.Handler(webhook.Config{Verifier: webhook.Onceguard{Secrets: [][]byte{secret}}}, notify)

	body := []byte(`{"id":"evt_1","amount":10}`)
	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/notifications", strings.NewReader(string(body)))
		r.Header.Set(webhook.OnceguardHeader, webhook.Onceguard{}.Sign(secret, time.Now(), body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, "balance", balance)
	}
	// Output:
	// 204 balance 10
	// 204 balance 10
	// 204 balance 10
}
