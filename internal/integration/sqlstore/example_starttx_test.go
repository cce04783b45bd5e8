package sqlstore_test

import (
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
)

// Deferred ("atomic phases"): the key's record is created in the
// handler's own transaction, with the withdrawal, so a first request
// costs one commit and a crash or rollback leaves neither. A retry finds
// the record and is replayed by the middleware; the handler never sees it.
func ExampleStore_StartTx() {
	dir, _ := os.MkdirTemp("", "starttx")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)")
	defer db.Close()
	_, _ = db.Exec(`CREATE TABLE withdrawals (user_id TEXT, idem_key TEXT, amount TEXT, UNIQUE (user_id, idem_key))`)
	store, err := sqlstore.New(db, sqldialect.SQLite, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	withdraw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call, _ := idempotency.FromContext(r.Context())
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		// The record first: a key seen before is the middleware's to answer.
		if err := store.StartTx(r.Context(), tx, call.Start()); call.Refused(err) {
			return
		} else if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO withdrawals VALUES (?, ?, '10.00')`, call.Scope.Principal, call.Key); err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		err = tx.Commit()
		call.Created() // committed (or perhaps): the answer below is the record's
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable) // a 5xx frees the key
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"status":"succeeded"}`))
	})
	h := idempotency.Middleware(idempotency.Config{
		Store:     store,
		Deferred:  true,
		Principal: func(r *http.Request) (string, error) { return "alice", nil }, // the signed-in user
	})(withdraw)

	for range 2 { // the client retried
		r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"10.00"}`))
		r.Header.Set("Idempotency-Key", "wd-7f3a")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body.String(), "replayed="+w.Header().Get("Idempotent-Replayed"))
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM withdrawals`).Scan(&n)
	fmt.Println(n, "withdrawal")
	// Output:
	// 201 {"status":"succeeded"} replayed=
	// 201 {"status":"succeeded"} replayed=true
	// 1 withdrawal
}
