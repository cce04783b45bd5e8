package pgnotify_test

import (
	"database/sql"
	"log"
	"net/http"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/pgnotify"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// A retry of an in-flight payment waits up to 5 s for the first answer,
// woken by PostgreSQL's NOTIFY, instead of being told 409.
func Example() {
	db, err := sql.Open("pgx", "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlstore.New(db, sqldialect.Postgres, &sqlstore.Options{Listener: pgnotify.Listener(db)})
	if err != nil {
		log.Fatal(err)
	}
	guard := idempotency.Middleware(idempotency.Config{Store: store, Wait: 5 * time.Second})
	http.Handle("POST /payments", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
}
