// Package sqlstore keeps idempotency records, submit tokens and the
// repeat-submit window in the application's own database (PostgreSQL,
// MySQL/MariaDB or SQLite), on the caller's *sql.DB. It imports no driver.
//
// Because the records live next to the business tables, a handler can
// complete a key's record in the same transaction as its business change
// (CompleteTx): a crash then leaves either both or neither, never money
// moved without its record or a record without its money. DoTx and
// OnceTx (an event id acted on once, for webhook receivers and queue
// consumers) run the caller's function in such a transaction themselves.
//
// Begin binds a submit token and creates the key's record in one
// transaction; concurrent Begins of one key are serialised by the primary
// key (INSERT ... ON CONFLICT DO NOTHING, then SELECT ... FOR UPDATE).
// Expired rows are pruned by Begins (one in PruneEvery); nothing runs in
// the background.
package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
	"github.com/onceguard/onceguard/token"
)

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// Prefix starts the three table names (idempotency, submit_tokens,
	// repeat_window). Default: "onceguard_".
	Prefix string
	// PruneEvery is how many Begins pass between two prunes of expired
	// rows. Default: 512.
	PruneEvery uint64
	// Timeout bounds the database work of a call whose context has no
	// deadline (CompleteTx's excepted: it runs in the caller's
	// transaction). Middleware makes its calls after the handler on such a
	// context, so that a client going away cannot stop a record from being
	// completed or freed; this keeps a stalled database from holding those
	// calls, and the request, for as long as the connection lives. It is
	// generous because SQLite's writers queue (its busy timeout applies to
	// each wait). Default: 30s; negative: none.
	Timeout time.Duration
	// Listener, on PostgreSQL, makes the store wake a retry that waits for
	// a key's in-flight first request (idempotency.Options.Wait) by
	// LISTEN/NOTIFY instead of being polled: Complete, CompleteTx and
	// Abandon then also send a NOTIFY (one statement more each). Default:
	// nil, no notifications. Other dialects: New refuses one.
	Listener Listener
}

// Store implements idemstore.FullStore on a *sql.DB. It is safe for
// concurrent use.
type Store struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	opts    Options
	q       queries
	st      *sqldb.Stmts // SQLite: hot statements prepared once; nil elsewhere
	ctes    sync.Map     // cteShape -> CTE (its text) of StartCTE

	migrateMu sync.Mutex
	migrated  atomic.Bool
	begins    atomic.Uint64
	hub       hub // Watch's, with a Listener
}

var _ idemstore.FullStore = (*Store)(nil)

var prefixRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,40}$`)

// New returns a Store on db. It does no I/O: Migrate, or the first call,
// creates the tables.
func New(db *sql.DB, dialect sqldialect.Dialect, opts *Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: nil *sql.DB")
	}
	o := Options{Prefix: "onceguard_", PruneEvery: 512, Timeout: 30 * time.Second}
	if opts != nil {
		if opts.Timeout != 0 {
			o.Timeout = opts.Timeout
		}
		if opts.Prefix != "" {
			o.Prefix = opts.Prefix
		}
		if opts.PruneEvery > 0 {
			o.PruneEvery = opts.PruneEvery
		}
		o.Listener = opts.Listener
	}
	if o.Listener != nil && dialect != sqldialect.Postgres {
		return nil, errors.New("sqlstore: a Listener needs PostgreSQL (LISTEN/NOTIFY)")
	}
	if !prefixRE.MatchString(o.Prefix) {
		return nil, fmt.Errorf("sqlstore: table prefix %q: want letters, digits and underscores", o.Prefix)
	}
	if dialect < sqldialect.Postgres || dialect > sqldialect.SQLite {
		return nil, fmt.Errorf("sqlstore: unknown dialect %d", dialect)
	}
	st := &Store{db: db, dialect: dialect, opts: o, q: buildQueries(dialect, o.Prefix)}
	if dialect == sqldialect.SQLite {
		st.st = sqldb.NewStmts(db)
	}
	return st, nil
}

// Migrate creates the tables if they do not exist. Safe to run from
// several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if s.migrated.Load() {
		return nil
	}
	s.migrateMu.Lock()
	defer s.migrateMu.Unlock()
	if s.migrated.Load() {
		return nil
	}
	for _, stmt := range s.q.create {
		if err := sqldb.Create(ctx, s.db, stmt); err != nil {
			if s.dialect == sqldialect.MySQL && strings.Contains(err.Error(), "Error 1061") {
				continue // the index is there (MySQL's CREATE INDEX has no IF NOT EXISTS)
			}
			return wrap("migrate", err)
		}
	}
	s.migrated.Store(true)
	return nil
}

func us(t time.Time) int64 { return t.UnixMicro() }

// bound returns ctx with Options.Timeout's deadline if it has none.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || s.opts.Timeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.opts.Timeout)
}

// Begin implements idemstore.Store.
func (s *Store) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return idemstore.BeginResult{}, err
	}
	if s.begins.Add(1)%s.opts.PruneEvery == 0 {
		s.prune(ctx, r.Now)
	}
	// One lease for every attempt: if an attempt's commit went through but
	// its answer was lost, the next finds the record carrying it, ours.
	lease := newLease()
	if (r.Token == nil || (r.Token.Signed && !r.Token.Expired)) && s.q.insertNew != "" {
		// A key not seen before, with no token to bind, is the common
		// case: one autocommitted INSERT that ignores only the id's
		// conflict, where the dialect has it. A row inserted means the
		// record is ours; anything else (a record exists, or an error)
		// takes the general path, which finds out what to do in a
		// transaction.
		var tokenHash any
		if r.Token != nil {
			tokenHash = r.Token.Hash // a signed token: held by this record, or refused by its UNIQUE index
		}
		out, err := s.st.Exec(ctx, s.db, s.q.insertNew, r.ID, r.Fingerprint, lease, us(r.Now.Add(r.Lease)), us(r.Now.Add(r.TTL)), tokenHash)
		if err == nil {
			if n, err := out.RowsAffected(); err == nil && n == 1 {
				return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease}, nil
			}
		}
	}
	var last error
	for i := range 20 { // retried on write conflicts and deadlocks, with jittered backoff
		res, err := s.begin(ctx, r, lease)
		if err == nil || !retryable(err) {
			if sqldb.Unavailable(err) && !errors.Is(err, idempotency.ErrUnavailable) {
				err = wrap("begin", err) // a statement after BeginTx lost the database: say so
			}
			return res, err
		}
		last = err
		time.Sleep(time.Duration(1+mrand.IntN(1<<min(i, 6))) * time.Millisecond)
	}
	return idemstore.BeginResult{}, wrap("begin", last)
}

func (s *Store) begin(ctx context.Context, r idemstore.BeginRequest, lease string) (res idemstore.BeginResult, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return res, wrap("begin", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var tokenHash any
	if r.Token != nil {
		tokenHash = r.Token.Hash
		// Held by another record (UNIQUE token_hash): used elsewhere.
		if err = s.signedFree(ctx, tx, r.Token.Hash, r.ID); err != nil {
			return res, err
		}
		if r.Token.Expired { // only the record it made may answer
			var holder string
			if err = tx.QueryRowContext(ctx, s.q.tokenRecord, r.Token.Hash).Scan(&holder); errors.Is(err, sql.ErrNoRows) {
				return res, token.ErrExpired
			} else if err != nil {
				return res, err
			}
		}
	}
	// Insert if absent, then read the row under a lock: it is ours if it
	// carries our lease (whatever the driver reports as rows affected).
	insert := func() error {
		_, err := tx.ExecContext(ctx, s.q.insertRecord, r.ID, r.Fingerprint, lease, us(r.Now.Add(r.Lease)), us(r.Now.Add(r.TTL)), tokenHash)
		return err
	}
	if err = insert(); err != nil {
		return res, err
	}
	var (
		fp                    string
		state                 int
		recLease              sql.NullString
		leaseUntil, expiresAt int64
		status                sql.NullInt64
		header                sql.NullString
		body                  []byte
	)
	err = tx.QueryRowContext(ctx, s.q.selectRecord, r.ID).Scan(&fp, &state, &recLease, &leaseUntil, &expiresAt, &status, &header, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return res, errConflict // deleted under us: try again
	}
	if err != nil {
		return res, err
	}
	if existing := recLease.String != lease; existing {
		now := us(r.Now)
		switch {
		case expiresAt <= now:
			if _, err = tx.ExecContext(ctx, s.q.deleteRecord, r.ID); err != nil {
				return res, err
			}
			if err = insert(); err != nil {
				return res, err
			}
		case fp != r.Fingerprint:
			res = idemstore.BeginResult{Outcome: idemstore.Mismatch, Record: &idemstore.Record{ID: r.ID, Fingerprint: fp}}
			return res, tx.Commit()
		case state == int(idemstore.Completed):
			resp := &idemstore.Response{Status: int(status.Int64), Body: body}
			if header.Valid && header.String != "" {
				var err error
				if resp.Header, err = idemstore.UnmarshalHeader(header.String); err != nil {
					return res, fmt.Errorf("sqlstore: stored header of %s: %w", r.ID, err)
				}
			}
			res = idemstore.BeginResult{Outcome: idemstore.Replay, Record: &idemstore.Record{ID: r.ID, Fingerprint: fp, State: idemstore.Completed, ExpiresAt: time.UnixMicro(expiresAt), Response: resp}}
			return res, tx.Commit()
		case leaseUntil > now:
			res = idemstore.BeginResult{Outcome: idemstore.InProgress, Record: &idemstore.Record{ID: r.ID, Fingerprint: fp, State: idemstore.InFlight}}
			return res, tx.Commit()
		default: // in flight, its holder gone: take over
			if _, err = tx.ExecContext(ctx, s.q.takeOver, lease, us(r.Now.Add(r.Lease)), r.ID); err != nil {
				return res, err
			}
			return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease, Recovered: true}, tx.Commit()
		}
	}
	if r.Token != nil && !r.Token.Signed {
		t := r.Token
		out, err := tx.ExecContext(ctx, s.q.bindToken, t.Scope, us(r.Now.Add(r.TTL)), t.Hash, t.Subject, t.Purpose, us(r.Now), t.Scope)
		if err != nil {
			return res, err
		}
		if n, err := out.RowsAffected(); err != nil || n == 0 {
			// Refused (or, on MySQL, bound to this scope already with the
			// same keep time): say why, from the row.
			if reason := s.tokenReason(ctx, tx, t, r.Now); reason != nil {
				err = reason
				return res, err
			}
		}
	}
	return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease}, tx.Commit()
}

// BindsSignedTokens implements idemstore.SignedTokenStore: a record holds
// its signed token's hash, which a UNIQUE index keeps to one record.
func (s *Store) BindsSignedTokens() {}

// signedFree returns token.ErrUsed when a record other than id holds the
// token hash (a signed token's only binding; a stored one's too).
func (s *Store) signedFree(ctx context.Context, q querier, hash, id string) error {
	var other string
	err := q.QueryRowContext(ctx, s.q.tokenRecord, hash).Scan(&other)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	case other != id:
		return token.ErrUsed
	}
	return nil
}

// unique reports a unique-constraint violation, in every dialect.
func unique(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, s := range []string{"23505", "Error 1062", "duplicate key", "UNIQUE constraint"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// tokenReason returns why a token may not be bound, or nil if it may.
func (s *Store) tokenReason(ctx context.Context, q querier, t *idemstore.TokenClaim, now time.Time) error {
	rec, err := s.getToken(ctx, q, t.Hash)
	if err != nil {
		return err
	}
	return rec.Check(t.Subject, t.Purpose, t.Scope, now)
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var errConflict = errors.New("sqlstore: write conflict")

// retryable reports write conflicts worth another try: our own, unique
// violations, deadlocks, serialisation failures, SQLite's busy.
func retryable(err error) bool {
	if errors.Is(err, errConflict) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"23505", "40001", "40P01", "Error 1062", "Error 1213", "Error 1205", "Deadlock", "duplicate key", "UNIQUE constraint", "database is locked", "SQLITE_BUSY"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Complete implements idemstore.Store.
func (s *Store) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.complete(ctx, s.db, id, lease, resp)
}

// CompleteTx completes the record inside the caller's transaction, so that
// the record and the business change commit together. Call
// idempotency.Call.MarkCompleted afterwards so that Middleware does not
// store the answer again. It returns ErrLeaseLost if the lease no longer
// holds the record (this request outlived its lease and a retry took the
// key over): roll back then, call idempotency.Call.Forget and answer 409
// with Retry-After, as for a key in progress. The request that owns the
// key now makes its outcome; the client's retry gets that.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, id, lease string, resp idemstore.Response) error {
	return s.complete(ctx, tx, id, lease, resp)
}

// DoTx is idempotency.Do for a consumer whose effect lives in this
// store's database: fn runs inside a transaction of the store's *sql.DB,
// and the result is stored in the same transaction (CompleteTx), so that
// the effect and its record commit together or not at all. A crash, or a
// lease taken over meanwhile, can never leave the effect made without its
// record, so a redelivery cannot make it twice, whatever fn's writes are.
// fn's error, a panic, or a lost lease (ErrLeaseLost) rolls back and frees
// the key; its other results are Do's. opts may be nil.
func (s *Store) DoTx(ctx context.Context, scope idempotency.Scope, key, fingerprint string, opts *idempotency.DoOptions,
	fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (result []byte, replayed bool, err error) {
	return idempotency.Do(ctx, s, scope, key, fingerprint, opts, func(ctx context.Context) ([]byte, error) {
		call, _ := idempotency.FromContext(ctx)
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("idempotency/sqlstore: do: %w", err)
		}
		committed := false
		defer func() {
			if !committed { // fn failed or panicked, or the record was not stored
				_ = tx.Rollback()
			}
		}()
		out, err := fn(ctx, tx)
		if err != nil {
			return nil, err
		}
		if err = s.CompleteTx(ctx, tx, call.ID, call.Lease, idemstore.Response{Status: 200, Body: out}); err != nil {
			return nil, fmt.Errorf("idempotency/sqlstore: do: storing the result: %w", err)
		}
		committed = true // a failed Commit has rolled back
		if err = tx.Commit(); err != nil {
			return nil, fmt.Errorf("idempotency/sqlstore: do: %w", err)
		}
		call.MarkCompleted()
		return out, nil
	})
}

// OnceTx is idempotency.Once for a receiver whose effect lives in this
// store's database: fn runs in a transaction of the store's *sql.DB, and
// the event is recorded in that same transaction (under the records'
// primary key), so that fn's effect and the record commit together or not
// at all. A delivery of an event already committed does not run fn
// (ran = false, err nil: answer it as done); one while another delivery
// holds the event returns idempotency.ErrInProgress (answer "retry later");
// fn's error or panic rolls the transaction back and frees the event for a
// redelivery at once. A process killed before its commit leaves nothing
// done, and its event is taken over once its lease (DoOptions.Lease) has
// run out; should a delivery outlive its lease and another take the event
// over, only one of the two can commit (the other gets ErrLeaseLost and
// rolls back). So neither a crash nor a duplicate, concurrent or late,
// makes fn's effect twice, whatever fn writes. ran is true only once fn's
// transaction has committed: acknowledge the event (a 2xx, an ack) after
// OnceTx returns, never inside fn. Events are remembered for DoOptions.TTL
// (default 24h). opts may be nil.
func (s *Store) OnceTx(ctx context.Context, source, eventID string, opts *idempotency.DoOptions,
	fn func(ctx context.Context, tx *sql.Tx) error) (ran bool, err error) {
	if source == "" || eventID == "" {
		return false, fmt.Errorf("idempotency/sqlstore: once: %w", idempotency.ErrKeyMissing)
	}
	_, replayed, err := s.DoTx(ctx, idempotency.OnceScope(source), eventID, "", opts, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		return nil, fn(ctx, tx)
	})
	if err != nil || replayed {
		return false, err
	}
	return true, nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *Store) complete(ctx context.Context, e execer, id, lease string, resp idemstore.Response) error {
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	args, err := completeArgs(id, lease, resp)
	if err != nil {
		return err
	}
	if s.opts.Listener != nil {
		// The NOTIFY in the same statement: a NOTIFY that fails fails the
		// completion, never the other way round (an answer stored, yet
		// reported as not).
		rows, err := e.QueryContext(ctx, s.q.completeNotify, append(args, s.channel())...)
		if err != nil {
			return wrap("complete", err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return wrap("complete", err)
		}
		if n == 0 {
			return idempotency.ErrLeaseLost
		}
		return nil
	}
	var out sql.Result
	if c, ok := e.(sqldb.Conn); ok {
		out, err = s.st.Exec(ctx, c, s.q.complete, args...)
	} else {
		out, err = e.ExecContext(ctx, s.q.complete, args...)
	}
	if err != nil {
		return wrap("complete", err)
	}
	if n, err := out.RowsAffected(); err != nil || n == 0 {
		return idempotency.ErrLeaseLost
	}
	return nil
}

// completeArgs are the arguments of the complete query.
func completeArgs(id, lease string, resp idemstore.Response) ([]any, error) {
	header, err := idemstore.MarshalHeader(resp.Header) // byte for byte, not UTF-8 only as JSON's strings
	if err != nil {
		return nil, err
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return []any{resp.Status, header, body, id, lease}, nil
}

// Abandon implements idemstore.Store.
func (s *Store) Abandon(ctx context.Context, id, lease string) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return wrap("abandon", err)
	}
	defer func() { _ = tx.Rollback() }()
	var tokenHash sql.NullString
	err = tx.QueryRowContext(ctx, s.q.selectLease, id, lease).Scan(&tokenHash)
	if errors.Is(err, sql.ErrNoRows) {
		return idempotency.ErrLeaseLost
	} else if err != nil {
		return wrap("abandon", err)
	}
	if _, err := tx.ExecContext(ctx, s.q.deleteRecord, id); err != nil {
		return wrap("abandon", err)
	}
	if tokenHash.Valid {
		if _, err := tx.ExecContext(ctx, s.q.unbindAny, tokenHash.String); err != nil {
			return wrap("abandon", err)
		}
	}
	if err := s.notify(ctx, tx, id); err != nil {
		return wrap("abandon", err)
	}
	return wrap("abandon", tx.Commit())
}

// ClaimWindow implements idemstore.WindowStore.
func (s *Store) ClaimWindow(ctx context.Context, id, owner string, window time.Duration, now time.Time) (time.Duration, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return 0, err
	}
	return s.claimWindow(ctx, s.db, id, owner, window, now)
}

// FreeWindow implements idemstore.WindowStore.
func (s *Store) FreeWindow(ctx context.Context, id, owner string) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, s.q.freeWindow, id, owner)
	return wrap("free window", err)
}

// PutToken implements token.Store.
func (s *Store) PutToken(ctx context.Context, r token.Record) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, s.q.putToken, r.Hash, r.Subject, r.Purpose, us(r.ExpiresAt), us(r.ExpiresAt))
	return wrap("put token", err)
}

// GetToken implements token.Store.
func (s *Store) GetToken(ctx context.Context, hash string) (token.Record, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return token.Record{}, err
	}
	return s.getToken(ctx, s.db, hash)
}

func (s *Store) getToken(ctx context.Context, q querier, hash string) (token.Record, error) {
	r := token.Record{Hash: hash}
	var exp int64
	var scope sql.NullString
	err := q.QueryRowContext(ctx, s.q.getToken, hash).Scan(&r.Subject, &r.Purpose, &exp, &scope)
	if errors.Is(err, sql.ErrNoRows) {
		return r, token.ErrUnknown
	} else if err != nil {
		return r, wrap("get token", err)
	}
	r.ExpiresAt, r.Scope = time.UnixMicro(exp), scope.String
	return r, nil
}

// BindToken implements token.Store. A token bound on its own is kept 24h.
func (s *Store) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return false, err
	}
	out, err := s.db.ExecContext(ctx, s.q.bindFresh, scope, us(now.Add(token.BoundTTL)), hash, subject, purpose, us(now))
	if err != nil {
		return false, wrap("bind token", err)
	}
	if n, err := out.RowsAffected(); err == nil && n == 1 {
		return true, nil
	}
	claim := &idemstore.TokenClaim{Hash: hash, Subject: subject, Purpose: purpose, Scope: scope}
	if reason := s.tokenReason(ctx, s.db, claim, now); reason != nil {
		return false, reason
	}
	return false, nil // bound to this scope already
}

// UnbindToken implements token.Store.
func (s *Store) UnbindToken(ctx context.Context, hash, scope string) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, s.q.unbind, hash, scope)
	return wrap("unbind token", err)
}

func (s *Store) prune(ctx context.Context, now time.Time) {
	for _, q := range s.q.prune {
		_, _ = s.db.ExecContext(ctx, q, us(now)) // best effort: the next prune retries
	}
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if sqldb.Unavailable(err) {
		return fmt.Errorf("sqlstore: %s: %w: %w", op, idempotency.ErrUnavailable, err)
	}
	return fmt.Errorf("sqlstore: %s: %w", op, err)
}

func newLease() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
