package webhook_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/onceguard/onceguard/webhook"
)

// A provider's callback endpoint: the handler runs only for a callback
// signed with the shared secret, and reads the raw body that was signed.
func ExampleHandler() {
	secret := []byte("whsec_from_the_provider")
	callbacks := webhook.Handler(webhook.Config{Verifier: webhook.Onceguard{Secrets: [][]byte{secret}}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Decode the event; record its id once in the transaction that acts on it.
			w.WriteHeader(http.StatusNoContent)
		}))

	body := `{"id":"evt_1","type":"operation.succeeded"}`
	for _, sig := range []string{
		webhook.Onceguard{}.Sign(secret, time.Now(), []byte(body)),                      // the provider's
		webhook.Onceguard{}.Sign([]byte("guess"), time.Now(), []byte(body)),             // a forgery
		webhook.Onceguard{}.Sign(secret, time.Now().Add(-10*time.Minute), []byte(body)), // a replay
	} {
		req := httptest.NewRequest(http.MethodPost, "/api/v1/psp/notifications", strings.NewReader(body))
		req.Header.Set(webhook.OnceguardHeader, sig)
		w := httptest.NewRecorder()
		callbacks.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()) != "")
	}
	// Output:
	// 204 false
	// 401 true
	// 401 true
}
