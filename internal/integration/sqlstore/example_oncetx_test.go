package sqlstore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
	"github.com/onceguard/onceguard/webhook"
)

// A provider's callback endpoint on the application's database: package
// webhook checks the signature, OnceTx credits the account in the
// transaction that records the event id, and the 204 goes out only after
// that commit. The provider delivers the event three times; the balance
// moves once.
func ExampleStore_OnceTx() {
	dir, _ := os.MkdirTemp("", "oncetx")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)")
	defer db.Close()
	_, _ = db.Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)`)
	_, _ = db.Exec(`INSERT INTO accounts VALUES ('alice', 0)`)
	store, err := sqlstore.New(db, sqldialect.SQLite, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	secret := []byte("whsec_from_the_provider")

	notify := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev struct {
			ID      string `json:"id"`
			Account string `json:"account"`
			Amount  int    `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.ID == "" {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		_, err := store.OnceTx(r.Context(), "psp", ev.ID, nil, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, ev.Amount, ev.Account)
			return err
		})
		switch {
		case errors.Is(err, idempotency.ErrInProgress):
			w.Header().Set("Retry-After", "1")
			http.Error(w, "in progress", http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		default: // committed now, or before
			w.WriteHeader(http.StatusNoContent)
		}
	})
	h := webhook.Handler(webhook.Config{Verifier: webhook.Onceguard{Secrets: [][]byte{secret}}}, notify)

	body := []byte(`{"id":"evt_1","account":"alice","amount":10}`)
	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/notifications", strings.NewReader(string(body)))
		r.Header.Set(webhook.OnceguardHeader, webhook.Onceguard{}.Sign(secret, time.Now(), body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var balance int
		_ = db.QueryRow(`SELECT balance FROM accounts WHERE id = 'alice'`).Scan(&balance)
		fmt.Println(w.Code, "balance", balance)
	}
	// Output:
	// 204 balance 10
	// 204 balance 10
	// 204 balance 10
}
