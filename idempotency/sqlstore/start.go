package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
	"github.com/onceguard/onceguard/token"
)

// StartTx creates a Deferred call's record (idempotency.Call.Start) in
// tx, the transaction that makes the request's effect: with it, its
// submit token is bound and its repeat-submit window entry claimed. st nil
// (the Guard created the record already) does nothing. A refusal is
// idemstore.ErrKeyTaken, a token's reason (token.ErrInvalid) or an
// *idemstore.WindowHeldError: roll tx back and pass it to
// idempotency.Call.Refused. After tx commits, call Call.Created.
//
// It takes one statement per part (the record, the token, the window) on
// every dialect; on PostgreSQL, StartCTE puts them and the effect in one.
func (s *Store) StartTx(ctx context.Context, tx *sql.Tx, st *idemstore.Start) error {
	if st == nil {
		return nil
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	var tokenHash any
	if st.Token != nil {
		tokenHash = st.Token.Hash
	}
	args := []any{st.ID, st.Fingerprint, st.Lease, us(st.LeaseUntil), us(st.ExpiresAt), tokenHash}
	// One Exec, read by its rows affected (1: inserted; a RETURNING would
	// cost SQLite a fifth of the statement). PostgreSQL and SQLite ignore
	// only the id's conflict; MySQL's no-op update takes either key's.
	query := s.q.insertNew
	if query == "" {
		query = s.q.insertRecord
	}
	out, err := s.st.Exec(ctx, tx, query, args...)
	if unique(err) && st.Token != nil {
		return token.ErrUsed // another record took the token meanwhile
	} else if err != nil {
		return wrap("start", err)
	}
	if n, err := out.RowsAffected(); err != nil {
		return wrap("start", err)
	} else if n != 1 {
		// On MySQL either key's duplicate: this record's id, or the
		// token's hash held by another record (used elsewhere).
		if st.Token != nil && s.q.insertNew == "" {
			if err := s.signedFree(ctx, tx, st.Token.Hash, st.ID); err != nil {
				return wrap("start", err)
			}
		}
		return idemstore.ErrKeyTaken
	}
	if t := st.Token; t != nil && !t.Signed {
		out, err := s.st.Exec(ctx, tx, s.q.bindToken, t.Scope, us(st.ExpiresAt), t.Hash, t.Subject, t.Purpose, us(st.Now), t.Scope)
		if err != nil {
			return wrap("start", err)
		}
		if n, err := out.RowsAffected(); err != nil || n == 0 {
			if reason := s.tokenReason(ctx, tx, t, st.Now); reason != nil {
				return reason
			}
		}
	}
	if st.WindowID != "" {
		left, err := s.claimWindow(ctx, tx, st.WindowID, st.WindowOwner, st.WindowUntil.Sub(st.Now), st.Now)
		if err != nil {
			return err
		}
		if left > 0 {
			return &idemstore.WindowHeldError{Left: left}
		}
	}
	return nil
}

// CTE is part of a PostgreSQL statement that a caller composes into its
// own: common table expressions, the condition its writes must meet, and
// the columns its SELECT list must carry, with their arguments.
type CTE struct {
	// With holds the expressions, comma-separated, for the statement's
	// WITH (join it to the caller's own with a comma).
	With string
	// Started is a condition that holds when the record was created, its
	// token bound and its window claimed: every write of the effect must
	// require it (WHERE ... AND Started, or FROM a CTE that does).
	Started string
	// Result is one column for the statement's SELECT list (it must be
	// read: it also makes the statement fail when the record was created
	// but its token or window refused, so that nothing of it commits):
	// scan it into an int64 and pass it to Store.Started.
	Result string
	// Args are the arguments of With's placeholders, numbered from the
	// caller's first.
	Args []any
}

// startRefused marks the error by which a composed statement refuses to
// commit a record whose token or window was refused.
const startRefused = "onceguard_start_refused"

// StartCTE composes a Deferred call's record (as StartTx creates it) into
// one PostgreSQL statement with the request's effect, so that both commit
// in one round trip, autocommitted: the record's placeholders are
// numbered from first ($first, $first+1, ...). after, if not "", names a
// CTE of the caller's that must yield a row for the record to be created
// (a session that is still live, say): without one, nothing is created
// and Started reports ErrKeyTaken, so check the caller's own condition
// first. st must not be nil. Scan CTE.Result and hand it, or the
// statement's error, to Started.
func (s *Store) StartCTE(st *idemstore.Start, first int, after string) (CTE, error) {
	if s.dialect != sqldialect.Postgres {
		return CTE{}, errors.New("sqlstore: StartCTE needs PostgreSQL")
	}
	p := s.opts.Prefix
	// The text depends only on the shape: built once per shape, so that it
	// costs no formatting per request (and pgx's statement cache finds it).
	shape := cteShape{first: first, after: after, token: st.Token != nil && !st.Token.Signed, window: st.WindowID != ""}
	cached, hit := s.ctes.Load(shape)
	n := first
	ph := func(v any, args *[]any) string {
		*args = append(*args, v)
		n++
		if hit {
			return ""
		}
		return fmt.Sprintf("$%d", n-1)
	}
	var args []any
	var tokenHash any
	if st.Token != nil {
		tokenHash = st.Token.Hash
	}
	from := ""
	if after != "" {
		from = " FROM " + after
	}
	var b strings.Builder
	emit := func(format string, a ...any) {
		if !hit {
			fmt.Fprintf(&b, format, a...)
		}
	}
	emit(`og_rec AS (
  INSERT INTO %sidempotency (id, fingerprint, state, lease, lease_until, expires_at, token_hash)
  SELECT %s, %s, 1, %s, %s::bigint, %s::bigint, %s::text%s
  ON CONFLICT (id) DO NOTHING RETURNING 1 AS n
)`, p, ph(st.ID, &args), ph(st.Fingerprint, &args), ph(st.Lease, &args), ph(us(st.LeaseUntil), &args), ph(us(st.ExpiresAt), &args), ph(tokenHash, &args), from)
	started := []string{`SELECT 1 FROM og_rec`}
	if t := st.Token; t != nil && !t.Signed { // a signed one: the record's UNIQUE token_hash binds it
		scope := ph(t.Scope, &args)
		emit(`, og_tok AS (
  UPDATE %ssubmit_tokens SET scope = %s, keep_until = %s::bigint
  WHERE hash = %s AND subject = %s AND purpose = %s AND ((scope IS NULL AND expires_at > %s::bigint) OR scope = %s)
    AND EXISTS (SELECT 1 FROM og_rec)
  RETURNING 1
)`, p, scope, ph(us(st.ExpiresAt), &args), ph(t.Hash, &args), ph(t.Subject, &args), ph(t.Purpose, &args), ph(us(st.Now), &args), scope)
		started = append(started, `SELECT 1 FROM og_tok`)
	}
	if st.WindowID != "" {
		rec := idemstore.WindowRecord(st.WindowOwner)
		now := ph(us(st.Now), &args)
		emit(`, og_win AS (
  INSERT INTO %srepeat_window AS w (id, owner, expires_at) SELECT %s, %s, %s::bigint FROM og_rec
  ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner,
    expires_at = CASE WHEN w.expires_at <= %s::bigint THEN EXCLUDED.expires_at ELSE w.expires_at END
  WHERE w.expires_at <= %s::bigint OR w.owner = %s OR substr(w.owner, 1, %s::int) = %s
  RETURNING 1
)`, p, ph(st.WindowID, &args), ph(st.WindowOwner, &args), ph(us(st.WindowUntil), &args), now, now, ph(rec, &args), ph(len(rec)+1, &args), ph(rec+"/", &args))
		started = append(started, `SELECT 1 FROM og_win`)
	}
	if hit {
		c := cached.(CTE)
		c.Args = args
		return c, nil
	}
	cond := make([]string, len(started))
	for i, q := range started {
		cond[i] = "EXISTS (" + q + ")"
	}
	all := strings.Join(cond, " AND ")
	// The check reads og_rec's rows, so it is never folded away at
	// planning: it fails the statement when the record was created but
	// its token or window was not.
	fmt.Fprintf(&b, `, og_check AS (
  SELECT CASE WHEN r.n > 0 AND NOT (%s) THEN CAST('%s:' || r.n AS int) ELSE r.n END AS n FROM (SELECT count(*) AS n FROM og_rec) r
)`, all, startRefused)
	c := CTE{With: b.String(), Started: "(" + all + ")", Result: `(SELECT n FROM og_check)`}
	s.ctes.Store(shape, c)
	c.Args = args
	return c, nil
}

// cteShape is what StartCTE's text depends on.
type cteShape struct {
	first         int
	after         string
	token, window bool
}

// Started reads a composed statement's outcome (StartCTE): created is
// its Result column, err its error. It returns nil when the record was
// created with the effect, ErrKeyTaken when the key had one (nothing
// written), the token's or the window's refusal (nothing committed), or
// err itself.
func (s *Store) Started(ctx context.Context, st *idemstore.Start, created int64, err error) error {
	if err != nil {
		if unique(err) && st.Token != nil && !strings.Contains(err.Error(), startRefused) {
			return token.ErrUsed // the token's hash is another record's
		}
		if !strings.Contains(err.Error(), startRefused) {
			return wrap("start", err)
		}
		// Refused, and rolled back: say why, from what refused it.
		if t := st.Token; t != nil && !t.Signed {
			if reason := s.tokenReason(ctx, s.db, t, st.Now); reason != nil {
				return reason
			}
		}
		if st.WindowID != "" {
			var owner string
			var exp int64
			if err := s.db.QueryRowContext(ctx, s.q.selectWindow, st.WindowID).Scan(&owner, &exp); err == nil {
				window := st.WindowUntil.Sub(st.Now)
				return &idemstore.WindowHeldError{Left: min(max(time.Duration(exp-us(st.Now))*time.Microsecond, time.Microsecond), window)}
			}
		}
		return idemstore.ErrKeyTaken // gone meanwhile: the Guard looks again
	}
	if created == 0 {
		return idemstore.ErrKeyTaken
	}
	return nil
}

// conn is a database or a transaction.
type conn = sqldb.Conn

// claimWindow is ClaimWindow on c.
func (s *Store) claimWindow(ctx context.Context, c conn, id, owner string, window time.Duration, now time.Time) (time.Duration, error) {
	rec := idemstore.WindowRecord(owner)
	var args []any
	if s.dialect != sqldialect.MySQL {
		args = []any{id, owner, us(now.Add(window)), us(now), us(now), rec, len(rec) + 1, rec + "/"}
	} else {
		args = []any{id, owner, us(now.Add(window)), us(now), rec, len(rec) + 1, rec + "/", us(now)}
	}
	out, err := s.st.Exec(ctx, c, s.q.claimWindow, args...)
	if err != nil {
		return 0, wrap("claim window", err)
	}
	if s.dialect != sqldialect.MySQL {
		// The upsert says whether it claimed the entry: a row changed is
		// ours; none, another's (read, for its time left). MySQL's count
		// does not tell an unchanged row of ours from another's: read it.
		if n, err := out.RowsAffected(); err != nil {
			return 0, wrap("claim window", err)
		} else if n == 1 {
			return 0, nil
		}
	}
	var got string
	var exp int64
	if err := s.st.QueryRow(ctx, c, s.q.selectWindow, id).Scan(&got, &exp); err != nil {
		return 0, wrap("claim window", err)
	}
	if got == owner {
		return 0, nil
	}
	// At most window: a request that started before the winner's sees more.
	return min(max(time.Duration(exp-us(now))*time.Microsecond, time.Microsecond), window), nil
}

// CompleteCTE composes Complete of the record id under lease into the
// caller's PostgreSQL statement (the settlement that makes its answer
// final, say), placeholders numbered from first, so that both commit in
// one round trip. Its With has no condition: the record completes when
// lease holds it, whatever the caller's writes did. Scan CTE.Result and
// pass it, or the statement's error, to Completed.
func (s *Store) CompleteCTE(id, lease string, resp idemstore.Response, first int) (CTE, error) {
	if s.dialect != sqldialect.Postgres {
		return CTE{}, errors.New("sqlstore: CompleteCTE needs PostgreSQL")
	}
	args, err := completeArgs(id, lease, resp)
	if err != nil {
		return CTE{}, err
	}
	n := first
	ph := make([]any, len(args))
	for i := range args {
		ph[i] = fmt.Sprintf("$%d", n+i)
	}
	with := fmt.Sprintf(`og_done AS (
  UPDATE %sidempotency SET state = 2, lease = NULL, status = %s::int, header = %s, body = %s
  WHERE id = %s AND state = 1 AND lease = %s RETURNING id
)`, s.opts.Prefix, ph[0], ph[1], ph[2], ph[3], ph[4])
	result := `(SELECT count(*) FROM og_done)`
	if s.opts.Listener != nil { // the waiters' NOTIFY, in the same statement
		args = append(args, s.channel())
		with += fmt.Sprintf(`, og_note AS (SELECT pg_notify($%d, id) FROM og_done)`, n+len(ph))
		result = `(SELECT count(*) FROM og_note)`
	}
	return CTE{With: with, Result: result, Args: args}, nil
}

// CompleteManyCTE composes Complete of many records into the caller's
// PostgreSQL statement (a batch of settlements, say), so that they all
// commit in one round trip. from names a relation of the caller's
// statement (one of its CTEs) with the columns id, lease, status, header
// and body: each row completes record id if lease still holds it, with
// the answer ResponseColumns encodes. The statement must read every row
// of CTE.Result, a relation (a CTE's name) of the ids it completed, in
// column id: that is how it learns which records it completed (a row not
// there lost its lease, as Completed's ErrLeaseLost), and, with a
// Listener, what sends their NOTIFY. Args holds the placeholders' values,
// numbered from first (none without a Listener); Started is unused.
func (s *Store) CompleteManyCTE(from string, first int) (CTE, error) {
	if s.dialect != sqldialect.Postgres {
		return CTE{}, errors.New("sqlstore: CompleteManyCTE needs PostgreSQL")
	}
	c := CTE{With: fmt.Sprintf(`og_done_many AS (
  UPDATE %sidempotency r SET state = 2, lease = NULL, status = f.status, header = f.header, body = f.body
  FROM %s f WHERE r.id = f.id AND r.state = 1 AND r.lease = f.lease RETURNING r.id
)`, s.opts.Prefix, from), Result: "og_done_many"}
	if s.opts.Listener != nil {
		c.With += fmt.Sprintf(`, og_note_many AS (SELECT id, pg_notify($%d, id) AS note FROM og_done_many)`, first)
		c.Result, c.Args = "og_note_many", []any{s.channel()}
	}
	return c, nil
}

// StartManyCTE composes the creation of many Deferred calls' records (as
// StartCTE creates one) into the caller's PostgreSQL statement, so that a
// batch of requests' records and effects commit in one round trip. from
// names a relation of the caller's statement (one of its CTEs) with the
// columns of idemstore.Start: id, fingerprint, lease, lease_until and
// expires_at (µs since the epoch, bigint), token_hash (a signed token's,
// or NULL; a token to bind in submit_tokens cannot be started here), and
// win_id, win_owner and win_until (NULL without a window). Each row's
// record is created unless its key has one, and its window entry claimed
// unless a live one exists at $first (the earliest of the rows' Now, µs):
// a row is started when both were. CTE.Result names the relation (column
// id) of the started records; make every write of the effect require its
// row there.
//
// It is all or nothing: a record created while its window was refused
// stays in the statement, so the caller must make the statement fail (and
// commit nothing) unless every row started and made its effect, and then
// run each request alone (StartCTE), which tells a refusal's reason. A
// live window entry of the same record, which StartCTE passes to the
// retry, refuses the row here. Args holds $first's value to set; Started
// is unused.
func (s *Store) StartManyCTE(from string, first int, now time.Time) (CTE, error) {
	if s.dialect != sqldialect.Postgres {
		return CTE{}, errors.New("sqlstore: StartManyCTE needs PostgreSQL")
	}
	p := s.opts.Prefix
	with := fmt.Sprintf(`og_rec_many AS (
  INSERT INTO %[1]sidempotency (id, fingerprint, state, lease, lease_until, expires_at, token_hash)
  SELECT f.id, f.fingerprint, 1, f.lease, f.lease_until, f.expires_at, f.token_hash FROM %[2]s f
  ON CONFLICT (id) DO NOTHING RETURNING id
), og_win_many AS (
  INSERT INTO %[1]srepeat_window AS w (id, owner, expires_at)
  SELECT f.win_id, f.win_owner, f.win_until FROM %[2]s f JOIN og_rec_many r ON r.id = f.id WHERE f.win_id IS NOT NULL
  ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
  WHERE w.expires_at <= $%[3]d::bigint
  RETURNING id
), og_started_many AS (
  SELECT f.id FROM %[2]s f JOIN og_rec_many r ON r.id = f.id
  WHERE f.win_id IS NULL OR f.win_id IN (SELECT id FROM og_win_many)
)`, p, from, first)
	return CTE{With: with, Result: "og_started_many", Args: []any{us(now)}}, nil
}

// ResponseColumns encodes resp as the status, header and body columns of
// CompleteManyCTE's relation, as Complete stores it.
func ResponseColumns(resp idemstore.Response) (status int, header string, body []byte, err error) {
	args, err := completeArgs("", "", resp)
	if err != nil {
		return 0, "", nil, err
	}
	return args[0].(int), args[1].(string), args[2].([]byte), nil
}

// Completed reads a composed statement's completion (CompleteCTE): nil
// when the record was completed, ErrLeaseLost when lease no longer held
// it, or err.
func (s *Store) Completed(n int64, err error) error {
	if err != nil {
		return wrap("complete", err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}
