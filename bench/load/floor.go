package main

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite", the service's

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/token"
)

// The floor is pgbench's transaction behind HTTP: a minimal withdrawal
// server, in Go on the service's driver (pgx through database/sql, a pool
// of 20 like the service's default), that the load drives exactly as it
// drives the service. The SQLite floor is the same server on SQLite, with
// the service's driver (modernc.org/sqlite) opened exactly as the service
// opens its embedded database (sqliteDSN: WAL, synchronous=NORMAL,
// busy_timeout 10 s, BEGIN IMMEDIATE; four connections, the WAL
// checkpointed beside the writers, write transactions run one at a time
// through a sqldb.WriteGate, each committed alone; the grouped SQLite
// floor commits those queued together, as the service does). A withdrawal is the ceiling's script and nothing
// more: BEGIN; UPDATE accounts … WHERE balance - amount >= 0 RETURNING
// balance; INSERT INTO ledger …; COMMIT. No session lookup (the bearer
// token is the account id), no Idempotency-Key record, no repeat window,
// no lock, no provider, no settlement, no logs or metrics.
//
// It is not a service anyone should run: it does none of the work that
// makes a withdrawal happen once. It measures what HTTP, Go and the driver
// cost on this machine on top of pgbench's transaction, so that the
// service's ratio to the ceiling can be read against the ratio of the
// least any withdrawal service does.
//
// It runs as a child process of the load (the load's own binary, with
// -floor-serve DSN, or -floor-sqlite-serve FILE) on a database of its own
// with the ceiling's schema plus a users table, and keeps no state in
// memory: a restart between rounds finds its users and their balances.

const floorSchema = pgbenchSchema + `
CREATE TABLE users (
  username TEXT PRIMARY KEY,
  aid      INT NOT NULL UNIQUE REFERENCES accounts (aid)
);
CREATE SEQUENCE account_ids;
`

// floorSQLiteSchema is floorSchema in SQLite's words: the ledger's id is
// AUTOINCREMENT as in the service's SQLite schema, the account id the
// rowid.
const floorSQLiteSchema = `
CREATE TABLE IF NOT EXISTS accounts (
  aid        INTEGER PRIMARY KEY,
  balance    BIGINT NOT NULL CHECK (balance >= 0),
  version    BIGINT NOT NULL DEFAULT 0,
  updated_at BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ledger (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  aid           INT NOT NULL REFERENCES accounts (aid),
  kind          VARCHAR(32) NOT NULL,
  amount        BIGINT NOT NULL,
  balance_after BIGINT NOT NULL CHECK (balance_after >= 0),
  ref           VARCHAR(32) NOT NULL,
  created_at    BIGINT NOT NULL,
  UNIQUE (kind, ref)
);
CREATE INDEX IF NOT EXISTS ledger_aid ON ledger (aid, id);
CREATE TABLE IF NOT EXISTS users (
  username TEXT PRIMARY KEY,
  aid      INT NOT NULL UNIQUE REFERENCES accounts (aid)
);
`

// sqliteDSN opens path as cmd/onceguard's openDB opens the service's
// embedded database: the same sqldb.SQLiteDSN, and as the service the
// floor checkpoints the WAL beside its writers (sqldb.CheckpointWAL) and
// runs its write transactions through a sqldb.WriteGate: queued in Go,
// and each committed alone (pgbench's transaction, one commit per
// withdrawal) unless the floor is the grouped one.
func sqliteDSN(path string) string { return sqldb.SQLiteDSN(path) }

// serveFloor serves the floor on 127.0.0.1:0 until SIGTERM or SIGINT, and
// says where as the service does ("listening on http://ADDR;"): on
// PostgreSQL (driver "pgx", dsn a URL) or on SQLite (driver "sqlite", dsn
// the file's path; the schema is created if missing). On SQLite, group is
// how many withdrawals one COMMIT may hold (1: each its own).
func serveFloor(driver, dsn string, group int) error {
	if driver == "sqlite" {
		dsn = sqliteDSN(dsn)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if driver != "sqlite" {
		db.SetMaxOpenConns(20)
		db.SetMaxIdleConns(20)
	} else { // as the service keeps SQLite (cmd/onceguard's sqliteConns)
		db.SetMaxOpenConns(4)
		db.SetMaxIdleConns(4)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	var gate *sqldb.WriteGate
	if driver == "sqlite" {
		if _, err := db.ExecContext(ctx, floorSQLiteSchema); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
		gate = &sqldb.WriteGate{MaxGroup: group, Watch: sqldb.SQLiteWatch} // as the service's
		go sqldb.CheckpointWAL(ctx, db, sqldb.CheckpointEvery)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: floorHandler(db, gate), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening on http://%s; floor: pgbench's transaction over HTTP on %s\n", ln.Addr(), driver)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// floorHandler serves the floor on db: on SQLite when gate is not nil.
func floorHandler(db *sql.DB, gate *sqldb.WriteGate) http.Handler {
	sqlite := gate != nil
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/users", func(w http.ResponseWriter, r *http.Request) {
		var c struct{ Username string }
		if json.NewDecoder(r.Body).Decode(&c) != nil || c.Username == "" {
			floorAnswer(w, http.StatusBadRequest, `{"code":"invalid_request"}`)
			return
		}
		var aid int
		var err error
		if sqlite { // no data-modifying WITH: two statements in one transaction
			err = gate.Run(r.Context(), db, func(ctx context.Context, tx *sql.Tx) error {
				if err := tx.QueryRowContext(ctx, `INSERT INTO accounts (balance) VALUES (0) RETURNING aid`).Scan(&aid); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO users (username, aid) VALUES ($1, $2)`, c.Username, aid)
				return err
			})
		} else {
			err = db.QueryRowContext(r.Context(), `WITH a AS (INSERT INTO accounts (aid, balance) VALUES (nextval('account_ids'), 0) RETURNING aid)
INSERT INTO users (username, aid) SELECT $1, aid FROM a RETURNING aid`, c.Username).Scan(&aid)
		}
		if err != nil {
			floorAnswer(w, http.StatusInternalServerError, `{"code":"internal"}`)
			return
		}
		floorAnswer(w, http.StatusCreated, fmt.Sprintf(`{"id":"%d","username":%q}`, aid, c.Username))
	})
	mux.HandleFunc("POST /api/v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		var c struct{ Username string }
		_ = json.NewDecoder(r.Body).Decode(&c)
		var aid int
		if err := db.QueryRowContext(r.Context(), `SELECT aid FROM users WHERE username = $1`, c.Username).Scan(&aid); err != nil {
			floorAnswer(w, http.StatusUnauthorized, `{"code":"unauthenticated"}`)
			return
		}
		floorAnswer(w, http.StatusCreated, fmt.Sprintf(`{"token":"fl_%d"}`, aid))
	})
	mux.HandleFunc("GET /api/v1/account", func(w http.ResponseWriter, r *http.Request) {
		aid, ok := floorAccount(r)
		var balance int64
		if !ok || db.QueryRowContext(r.Context(), `SELECT balance FROM accounts WHERE aid = $1`, aid).Scan(&balance) != nil {
			floorAnswer(w, http.StatusUnauthorized, `{"code":"unauthenticated"}`)
			return
		}
		floorAnswer(w, http.StatusOK, `{"balance":"`+fmtCents(balance)+`"}`)
	})
	tokens := floorTokens()
	mux.HandleFunc("POST /api/v1/submit-tokens", floorMint(db, tokens))
	mux.HandleFunc("POST /api/v1/deposits", floorMove(db, gate, nil, 1))
	mux.HandleFunc("POST /api/v1/withdrawals", floorMove(db, gate, tokens, -1))
	return mux
}

// floorTokens signs the floor's submit tokens as the service signs its
// own (token.Options.Key: a signature, no write), with a key of this
// process.
func floorTokens() *token.Tokens {
	var key [32]byte
	_, _ = crand.Read(key[:])
	return token.New(nil, &token.Options{Key: key[:]})
}

// floorSessionRead is the floor mint's session read: the contract's "the
// token stops working at once" needs one per mint, and this is the least
// one, a row by its unique key.
const floorSessionRead = `SELECT username FROM users WHERE aid = $1`

// floorMint is the least a submit token's mint costs: POST
// /api/v1/submit-tokens {"purpose"}, the session read, a signed token
// (tokens.Issue, as the service mints them) and its answer. The group
// floor-minted mints one before each withdrawal, as the service's default
// configuration does.
func floorMint(db *sql.DB, tokens *token.Tokens) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		aid, ok := floorAccount(r)
		var name string
		if !ok || db.QueryRowContext(r.Context(), floorSessionRead, aid).Scan(&name) != nil {
			floorAnswer(w, http.StatusUnauthorized, `{"code":"unauthenticated"}`)
			return
		}
		var req struct{ Purpose string }
		if json.NewDecoder(r.Body).Decode(&req) != nil || req.Purpose != "withdrawal" {
			floorAnswer(w, http.StatusBadRequest, `{"code":"invalid_purpose"}`)
			return
		}
		is, err := tokens.Issue(r.Context(), strconv.Itoa(aid), req.Purpose)
		if err != nil {
			floorAnswer(w, http.StatusInternalServerError, `{"code":"internal"}`)
			return
		}
		floorAnswer(w, http.StatusCreated, `{"token":"`+is.Token+`","purpose":"`+is.Purpose+`","expires_at":"`+is.ExpiresAt.UTC().Format(time.RFC3339)+`"}`)
	}
}

// The ceiling's transaction, as the floor runs it.
const (
	floorUpdate = `UPDATE accounts SET balance = balance + $1, version = version + 1, updated_at = $2 WHERE aid = $3 AND balance + $1 >= 0 RETURNING balance`
	floorInsert = `INSERT INTO ledger (aid, kind, amount, balance_after, ref, created_at) VALUES ($1, $2, $3, $4, $5, $6)`
)

// floorMove answers a deposit (sign 1) or a withdrawal (sign -1): the
// ceiling's transaction, with the amount from the body. On SQLite its two
// statements are prepared once, as the service prepares its own there
// (internal/sqldb.Stmts); pgx caches them on PostgreSQL.
//
// A withdrawal whose Idempotency-Key is a submit token needs a token that
// tokens signed for its user (tokens.Verify, as the service checks one);
// any other key is not looked at.
func floorMove(db *sql.DB, gate *sqldb.WriteGate, tokens *token.Tokens, sign int64) http.HandlerFunc {
	var stmts *sqldb.Stmts
	if gate != nil {
		stmts = sqldb.NewStmts(db)
	}
	kind := map[int64]string{1: "deposit", -1: "withdrawal"}[sign]
	return func(w http.ResponseWriter, r *http.Request) {
		aid, ok := floorAccount(r)
		if !ok {
			floorAnswer(w, http.StatusUnauthorized, `{"code":"unauthenticated"}`)
			return
		}
		if key := r.Header.Get("Idempotency-Key"); tokens != nil && token.IsToken(key) && tokens.Verify(key, strconv.Itoa(aid), "withdrawal") != nil {
			floorAnswer(w, http.StatusBadRequest, `{"code":"submit_token_invalid"}`)
			return
		}
		var req struct{ Amount string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			floorAnswer(w, http.StatusBadRequest, `{"code":"invalid_json"}`)
			return
		}
		cents, ok := parseCents(req.Amount)
		if !ok || cents <= 0 {
			floorAnswer(w, http.StatusBadRequest, `{"code":"invalid_amount"}`)
			return
		}
		ref := mrand.Int64N(9_000_000_000_000_000_000) + 1
		delta := sign * cents
		err := gate.Run(r.Context(), db, func(ctx context.Context, tx *sql.Tx) error {
			var balance int64
			if err := stmts.QueryRow(ctx, tx, floorUpdate, delta, ref, aid).Scan(&balance); err != nil {
				return err
			}
			_, err := stmts.Exec(ctx, tx, floorInsert, aid, kind, delta, balance, strconv.FormatInt(ref, 10), ref)
			return err
		})
		switch {
		case errors.Is(err, sql.ErrNoRows):
			floorAnswer(w, http.StatusUnprocessableEntity, `{"code":"insufficient_funds"}`)
		case err != nil:
			fmt.Fprintln(os.Stderr, "floor:", kind, err)
			floorAnswer(w, http.StatusServiceUnavailable, `{"code":"store_unavailable"}`)
		default:
			floorAnswer(w, http.StatusCreated, `{"id":"`+strconv.FormatInt(ref, 10)+`","amount":"`+fmtCents(cents)+`","status":"succeeded"}`)
		}
	}
}

// floorAccount reads the account id from "Authorization: Bearer fl_<aid>".
func floorAccount(r *http.Request) (int, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer fl_")
	if !ok {
		return 0, false
	}
	aid, err := strconv.Atoi(tok)
	return aid, err == nil && aid > 0
}

func floorAnswer(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
