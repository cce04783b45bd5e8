package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/sqldialect"
	"github.com/onceguard/onceguard/token"
)

// Withdraw records a pending withdrawal, debits it if the balance covers
// it (app.ErrInsufficientFunds) and writes its ledger entry, in one
// transaction; the same (user, key) returns the first one, created false.
// The row goes first, so that a duplicate fails on UNIQUE(user_id,
// idempotency_key) before touching money.
//
// fence is the caller's lock's fencing token (0: none); the account
// refuses one older than it accepted (app.ErrStaleFence), so a holder
// whose lock ran out cannot write after the next holder did.
//
// chk, if not nil, is checked and created in the same transaction: the
// session must be live (app.ErrSessionEnded, nothing written) and the
// key's record is created with the withdrawal (Records.StartTx; its
// refusal is returned, nothing written). A refusal for funds still
// commits the record, so that its answer is kept.
func (s *Store) Withdraw(ctx context.Context, m app.Movement, fence int64, chk *app.TxChecks) (got app.Movement, created bool, err error) {
	defer s.timed("withdraw", time.Now(), &err)
	m.Kind, m.Status = app.Withdrawal, app.Pending
	c, err := s.checks(chk)
	if err != nil {
		return m, false, err
	}
	if s.d == sqldialect.Postgres && s.BatchDebit && batchable(c) {
		m, created, err = s.withdrawBatched(ctx, m, fence, c)
	} else if s.d == sqldialect.Postgres {
		m, created, err = s.withdrawOne(ctx, m, fence, c)
	} else {
		m, created, err = s.withdrawTx(ctx, m, fence, c)
		if errors.Is(err, app.ErrInsufficientFunds) && c.start != nil {
			// The refusal is the key's answer: its record alone, in a transaction of its own.
			if serr := s.startAlone(ctx, c.start); serr != nil {
				err = serr
			}
		}
	}
	return m, created, refusal(err)
}

// checks is app.TxChecks as the store uses it.
type checks struct {
	session string
	start   *idemstore.Start
}

// checks returns chk (nil: none) as the store uses it.
func (s *Store) checks(chk *app.TxChecks) (checks, error) {
	var c checks
	if chk == nil {
		return c, nil
	}
	c.session = chk.SessionHash
	if chk.Start != nil {
		st, ok := chk.Start.(*idemstore.Start)
		if !ok {
			return c, fmt.Errorf("sqlstore: withdraw: a key's record to start is an *idemstore.Start, not %T", chk.Start)
		}
		if s.Records == nil {
			return c, errors.New("sqlstore: withdraw: no Records to create the key's record")
		}
		c.start = st
	}
	return c, nil
}

// refusal marks the key store's refusals to create a record as app.StartRefusedError.
func refusal(err error) error {
	var held *idemstore.WindowHeldError
	if errors.Is(err, idemstore.ErrKeyTaken) || errors.As(err, &held) || errors.Is(err, token.ErrInvalid) {
		return &app.StartRefusedError{Err: err}
	}
	return err
}

// errDuplicate rolls back a transaction that met a row of its key: the
// caller reads that row.
var errDuplicate = errors.New("sqlstore: the key's row exists")

// withdrawTx is Withdraw in a transaction of several statements (MySQL, SQLite).
func (s *Store) withdrawTx(ctx context.Context, m app.Movement, fence int64, chk checks) (app.Movement, bool, error) {
	err := s.gate.Run(ctx, s.db, func(ctx context.Context, tx *sql.Tx) error {
		if err := s.lockRow(ctx, tx, "accounts", "user_id", m.UserID); err != nil {
			return err
		}
		if chk.start != nil {
			if err := s.Records.StartTx(ctx, tx, chk.start); err != nil {
				if chk.session != "" && s.sessionEnded(ctx, tx, chk.session, m.UserID, m.CreatedAt) {
					return app.ErrSessionEnded // first, as the contract's order says
				}
				return err
			}
		}
		// The row, if the session is still live: one statement for both.
		insert, args := `INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			[]any{m.ID, m.UserID, m.Key, int64(m.Amount), string(m.Status), us(m.CreatedAt)}
		if chk.session != "" {
			dual := ``
			if s.d == sqldialect.MySQL {
				dual = ` FROM DUAL`
			}
			insert = `INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) SELECT ?, ?, ?, ?, ?, ?` + dual + `
WHERE EXISTS (SELECT 1 FROM sessions WHERE token_hash = ? AND user_id = ? AND expires_at > ?)`
			args = append(args, chk.session, m.UserID, us(m.CreatedAt))
		}
		res, err := s.st.Exec(ctx, tx, s.q(insert), args...)
		if duplicate(err) {
			return errDuplicate
		} else if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return app.ErrSessionEnded // rolled back: the record with it
		}
		after, err := s.adjustFenced(ctx, tx, m.UserID, -m.Amount, fence, us(m.CreatedAt))
		if err != nil {
			return err
		}
		return s.ledger(ctx, tx, m.UserID, app.EntryWithdrawal, -m.Amount, after, m.ID, us(m.CreatedAt))
	})
	if errors.Is(err, errDuplicate) { // rolled back: the record is started alone
		existing, ferr := s.movementByKey(ctx, app.Withdrawal, m.UserID, m.Key)
		if ferr == nil && chk.start != nil {
			ferr = s.startAlone(ctx, chk.start) // the first one's answer is this key's too
		}
		return existing, false, ferr
	}
	return m, err == nil, err
}

// sessionEnded reports whether the session with hash is no longer live for userID at now, read
// in tx (on SQLite's few connections, a transaction must not wait for a second one).
func (s *Store) sessionEnded(ctx context.Context, tx *sql.Tx, hash, userID string, now time.Time) bool {
	var one int
	err := tx.QueryRowContext(ctx, s.q(`SELECT 1 FROM sessions WHERE token_hash = ? AND user_id = ? AND expires_at > ?`), hash, userID, us(now)).Scan(&one)
	return errors.Is(err, sql.ErrNoRows)
}

// startAlone creates a key's record in a transaction of its own.
func (s *Store) startAlone(ctx context.Context, st *idemstore.Start) error {
	return s.gate.Run(ctx, s.db, func(ctx context.Context, tx *sql.Tx) error {
		return s.Records.StartTx(ctx, tx, st)
	})
}

// lockRow locks the row of table whose column is v, on MySQL only, so that
// concurrent requests for one account or order queue on that row: InnoDB
// waiters on the unique entry of a transaction that rolls back deadlock.
func (s *Store) lockRow(ctx context.Context, tx *sql.Tx, table, column, v string) error {
	if s.d != sqldialect.MySQL {
		return nil
	}
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+table+` WHERE `+column+` = ? FOR UPDATE`, v).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // the statements that follow say what is missing
	}
	return err
}

// withdrawOne is Withdraw on PostgreSQL in one statement (one round trip,
// one commit): the session's check, the key's record (Records.StartCTE)
// and the debit, with the row and the entry inserted from the debit's
// result, so no debit, nothing inserted, and a duplicate key fails it all.
func (s *Store) withdrawOne(ctx context.Context, m app.Movement, fence int64, chk checks) (app.Movement, bool, error) {
	set, cond, args := ``, ``, []any{m.ID, m.UserID, m.Key, int64(m.Amount), us(m.CreatedAt)}
	if fence != 0 { // record the fence, and refuse an older one
		set, cond, args = `, fence = $6`, ` AND fence <= $6`, append(args, fence)
	}
	with, sel, after := ``, ``, ``
	if chk.session != "" {
		n := len(args)
		args = append(args, chk.session, us(m.CreatedAt))
		with = fmt.Sprintf(`sess AS (SELECT 1 FROM sessions WHERE token_hash = $%d AND user_id = $2 AND expires_at > $%d), `, n+1, n+2)
		cond += ` AND EXISTS (SELECT 1 FROM sess)`
		sel, after = `, EXISTS (SELECT 1 FROM sess)`, `sess`
	}
	if chk.start != nil {
		cte, err := s.Records.StartCTE(chk.start, len(args)+1, after)
		if err != nil {
			return m, false, err
		}
		args = append(args, cte.Args...)
		with += cte.With + `, `
		cond += ` AND ` + cte.Started
		sel += `, ` + cte.Result
	}
	var (
		after64 sql.NullInt64
		live    = true
		started int64
	)
	dest := []any{&after64}
	if chk.session != "" {
		dest = append(dest, &live)
	}
	if chk.start != nil {
		dest = append(dest, &started)
	}
	err := s.db.QueryRowContext(ctx, `WITH `+with+`acct AS (
  UPDATE accounts SET balance = balance - $4, version = version + 1, updated_at = $5`+set+`
  WHERE user_id = $2 AND balance - $4 >= 0`+cond+`
  RETURNING balance
), wd AS (
  INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) SELECT $1, $2, $3, $4, 'pending', $5 FROM acct
), pend AS (
  INSERT INTO pending_movements (id, kind, created_at) SELECT $1, 'withdrawal', $5 FROM acct
), led AS (
  INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) SELECT $2, 'withdrawal', -$4, balance, $1, $5 FROM acct
)
SELECT (SELECT balance FROM acct)`+sel, args...).Scan(dest...)
	switch {
	case duplicate(err):
		// All of it rolled back: the key's withdrawal is the first one, and its record is to be made alone.
		existing, ferr := s.movementByKey(ctx, app.Withdrawal, m.UserID, m.Key)
		if ferr == nil && chk.start != nil {
			ferr = s.startAlone(ctx, chk.start)
		}
		return existing, false, ferr
	case err != nil && chk.start != nil:
		return m, false, s.Records.Started(ctx, chk.start, 0, err)
	case err != nil:
		return m, false, err
	case !live:
		return m, false, app.ErrSessionEnded
	}
	if chk.start != nil {
		if err := s.Records.Started(ctx, chk.start, started, nil); err != nil {
			return m, false, err
		}
	}
	if after64.Valid {
		return m, true, nil
	}
	// Nothing changed but the key's record: say why.
	// The key's withdrawal first, as Withdraw's INSERT would find it.
	if existing, ferr := s.movementByKey(ctx, app.Withdrawal, m.UserID, m.Key); ferr == nil {
		return existing, false, nil
	} else if !errors.Is(ferr, app.ErrNotFound) {
		return m, false, ferr
	}
	var last int64
	if err := s.db.QueryRowContext(ctx, `SELECT fence FROM accounts WHERE user_id = $1`, m.UserID).Scan(&last); err != nil {
		return m, false, err
	}
	if fence != 0 && last > fence {
		if chk.start != nil { // a stale writer's record is not the key's: freed for the retry under a new lease
			if err := s.Records.Abandon(ctx, chk.start.ID, chk.start.Lease); err != nil {
				return m, false, err
			}
		}
		return m, false, app.ErrStaleFence
	}
	return m, false, app.ErrInsufficientFunds
}

// adjust changes a balance by delta, refusing to go below zero, and
// returns the balance after; the version column advances with every change.
func (s *Store) adjust(ctx context.Context, tx *sql.Tx, userID string, delta money.Amount, now int64) (money.Amount, error) {
	ok, after, err := s.update(ctx, tx, `UPDATE accounts SET balance = balance + ?, version = version + 1, updated_at = ? WHERE user_id = ? AND balance + ? >= 0`,
		userID, int64(delta), now, userID, int64(delta))
	if err == nil && !ok {
		err = app.ErrInsufficientFunds
	}
	return after, err
}

// update runs a conditional UPDATE of userID's account and reports whether
// it changed the row, and the balance after (RETURNING, or read back on MySQL).
func (s *Store) update(ctx context.Context, tx *sql.Tx, query, userID string, args ...any) (bool, money.Amount, error) {
	var after int64
	if s.d != sqldialect.MySQL {
		err := s.st.QueryRow(ctx, tx, s.q(query+` RETURNING balance`), args...).Scan(&after)
		if errors.Is(err, sql.ErrNoRows) {
			return false, 0, nil
		}
		return err == nil, money.Amount(after), err
	}
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return false, 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, 0, err
	}
	err = tx.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE user_id = ?`, userID).Scan(&after)
	return err == nil, money.Amount(after), err
}

// adjustFenced is adjust for a writer holding a lock with fence: the
// account must not have accepted a newer fence, and records this one.
func (s *Store) adjustFenced(ctx context.Context, tx *sql.Tx, userID string, delta money.Amount, fence, now int64) (money.Amount, error) {
	if fence == 0 {
		return s.adjust(ctx, tx, userID, delta, now)
	}
	ok, after, err := s.update(ctx, tx, `UPDATE accounts SET balance = balance + ?, version = version + 1, fence = ?, updated_at = ?
WHERE user_id = ? AND balance + ? >= 0 AND fence <= ?`, userID, int64(delta), fence, now, userID, int64(delta), fence)
	if err != nil {
		return 0, err
	}
	if !ok {
		var last int64
		if err := tx.QueryRowContext(ctx, s.q(`SELECT fence FROM accounts WHERE user_id = ?`), userID).Scan(&last); err != nil {
			return 0, err
		}
		if last > fence {
			return 0, app.ErrStaleFence
		}
		return 0, app.ErrInsufficientFunds
	}
	return after, nil
}

func (s *Store) ledger(ctx context.Context, tx *sql.Tx, userID string, kind app.EntryKind, amount, after money.Amount, ref string, now int64) error {
	_, err := s.st.Exec(ctx, tx, s.q(`INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		userID, string(kind), int64(amount), int64(after), ref, now)
	return err
}

// CreateDeposit records a pending deposit (no money yet); a second one
// under the same key returns the first, with created false.
func (s *Store) CreateDeposit(ctx context.Context, m app.Movement) (got app.Movement, created bool, err error) {
	defer s.timed("create_deposit", time.Now(), &err)
	m.Kind, m.Status = app.Deposit, app.Pending
	insert := `INSERT INTO deposits (id, user_id, idempotency_key, amount, status, created_at) VALUES (?, ?, ?, ?, ?, ?)`
	if s.d == sqldialect.Postgres { // and into the backlog (migration 008)
		insert = `WITH d AS (` + insert + ` RETURNING id, created_at)
INSERT INTO pending_movements (id, kind, created_at) SELECT id, 'deposit', created_at FROM d`
	}
	_, err = s.db.ExecContext(ctx, s.q(insert), m.ID, m.UserID, m.Key, int64(m.Amount), string(m.Status), us(m.CreatedAt))
	if duplicate(err) {
		return s.movementByKeyCreated(ctx, app.Deposit, m.UserID, m.Key)
	}
	return m, err == nil, err
}

func (s *Store) movementByKeyCreated(ctx context.Context, k app.Kind, userID, key string) (app.Movement, bool, error) {
	existing, err := s.movementByKey(ctx, k, userID, key)
	return existing, false, err
}

// Settle moves a pending movement to outcome, crediting a deposit's
// success or refunding a withdrawal's failure with its ledger entry, and
// completes rec through Records, all in one transaction (rec nil: none).
// One settled before is left as it is, moved false: the update is
// conditional, and the ledger's UNIQUE(kind, ref) refuses a second entry.
//
// event, unless "", is a provider callback's id, inserted first in the same
// transaction: psp_events' UNIQUE(event_id) refuses it a second time
// (app.ErrDuplicateEvent, nothing changes), also when two deliveries of it
// run at once on two instances. A settlement whose outcome contradicts the
// movement's final status commits nothing, not its event, not rec: it
// returns moved false and that status, and the caller completes rec with
// the answer for it (Settle again, outcome that status).
//
// With Events set, the movement's event is written in the same
// transaction when this call moved it: one event per settlement, whoever
// settled it (a request, a callback or the reconciler).
func (s *Store) Settle(ctx context.Context, kind app.Kind, id string, outcome app.Status, now time.Time, rec *app.Record, event string) (moved bool, status app.Status, err error) {
	defer s.timed("settle", time.Now(), &err)
	if outcome != app.Succeeded && outcome != app.Failed {
		// Pending would "settle" a pending row as pending and take it out
		// of the backlog (unpend): a movement no reconciler finds again.
		return false, "", fmt.Errorf("sqlstore: settle: outcome %q is not final", outcome)
	}
	var credit bool
	var entry app.EntryKind
	switch kind {
	case app.Deposit: // a deposit's money arrives only with its success
		credit, entry = outcome == app.Succeeded, app.EntryDeposit
	case app.Withdrawal: // a withdrawal's left at creation: only a failure brings it back
		credit, entry = outcome != app.Succeeded, app.EntryWithdrawalRefund
	}
	t, err := table(kind)
	if err != nil {
		return false, "", err
	}
	if rec != nil && s.Records == nil {
		return false, "", errors.New("sqlstore: settle: no Records to complete the key's record")
	}
	if s.d == sqldialect.Postgres && rec != nil && !credit && event == "" && s.Events == nil {
		if s.BatchSettle && kind == app.Withdrawal {
			return s.settleBatched(ctx, id, outcome, rec, s.AsyncSettle)
		}
		return s.settleOne(ctx, t, id, outcome, rec, s.AsyncSettle && kind == app.Withdrawal)
	}
	err = s.gate.Run(ctx, s.db, func(ctx context.Context, tx *sql.Tx) (err error) {
		if event != "" {
			// MySQL: deliveries for one movement queue on its row before inserting their event
			// id. Otherwise duplicates of an event whose first insert rolls back (it contradicts
			// the movement, settled otherwise meanwhile) all hold shared locks on that key and
			// all want to insert it: InnoDB deadlocks them (1213, answered 5xx, not 409 or 204).
			if err := s.lockRow(ctx, tx, t, "id", id); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, s.q(`INSERT INTO psp_events (event_id, movement_id, status, received_at) VALUES (?, ?, ?, ?)`),
				event, id, string(outcome), us(now))
			if duplicate(err) {
				return app.ErrDuplicateEvent
			} else if err != nil {
				return err
			}
		}
		var userID string
		var amount int64
		moved, userID, amount, status, err = s.settleRow(ctx, tx, t, id, outcome, credit)
		if err != nil {
			return err
		}
		if !moved && status != outcome {
			return errContradicted // a contradiction changes nothing: the rollback drops the event and rec
		}
		if moved && credit {
			after, err := s.adjust(ctx, tx, userID, money.Amount(amount), us(now))
			if err != nil {
				return err
			}
			if err := s.ledger(ctx, tx, userID, entry, money.Amount(amount), after, id, us(now)); err != nil {
				return err
			}
		}
		if moved && s.Events != nil { // the event of this change, in its transaction
			m, err := scanMovement(tx.QueryRowContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+` WHERE id = ?`), id), kind)
			if err != nil {
				return err
			}
			if err := s.Events.Settled(ctx, tx, m, now); err != nil {
				return err
			}
		}
		if rec != nil {
			resp := idemstore.Response{Status: rec.Answer.Status, Header: rec.Answer.Header, Body: rec.Answer.Body}
			return s.Records.CompleteTx(ctx, tx, rec.ID, rec.Lease, resp)
		}
		return nil
	})
	switch {
	case errors.Is(err, errContradicted):
		return false, status, nil
	case err != nil:
		return false, "", err
	}
	if moved && s.Events != nil {
		s.Events.Committed()
	}
	return moved, status, nil
}

// errContradicted rolls back a settlement that its movement's status
// contradicts: Settle returns that status.
var errContradicted = errors.New("sqlstore: the movement was settled otherwise")

// noMovement and settledAs mark the errors by which settleOne's statement
// refuses to complete the record: no such movement; the movement was
// settled otherwise (settledAs, then its status), or by a statement that
// committed after this one's snapshot (settledAs + "pending").
const (
	noMovement = "onceguard_no_movement"
	settledAs  = "onceguard_settled_as:"
)

// settleOne is Settle on PostgreSQL of a movement whose settlement moves no money and writes no
// event (a withdrawal that succeeded, a deposit that failed), with its key's record completed in
// the same statement (Records.CompleteCTE): one round trip, one commit, which does not wait for
// its WAL flush when async (AsyncSettle, a withdrawal). A record whose lease was lost leaves the
// settlement committed: app.ErrRecordLost. A movement settled otherwise commits nothing and
// returns its status, as Settle says.
func (s *Store) settleOne(ctx context.Context, table, id string, outcome app.Status, rec *app.Record, async bool) (bool, app.Status, error) {
	resp := idemstore.Response{Status: rec.Answer.Status, Header: rec.Answer.Header, Body: rec.Answer.Body}
	cte, err := s.Records.CompleteCTE(rec.ID, rec.Lease, resp, 3)
	if err != nil {
		return false, "", err
	}
	asyncCol := ""
	if async {
		// set_config's local value is this statement's transaction's: its
		// commit does not wait for the WAL flush (see AsyncSettle).
		asyncCol = `, set_config('synchronous_commit', 'off', true)`
	}
	// og_found fails the statement, the record's completion with it, when
	// there is no such movement or it was not moved here and is not
	// outcome: settled otherwise, or pending in this statement's snapshot
	// though mv found it settled (another settlement committed meanwhile:
	// tried again, with a new snapshot). It reads the table, so it is never
	// folded away at planning.
	q := `WITH mv AS (
  UPDATE ` + table + ` SET status = $1 WHERE id = $2 AND status = 'pending' RETURNING 1
), ` + unpend + `, og_found AS (
  SELECT CASE WHEN count(*) = 0 THEN CAST('` + noMovement + `:' || count(*) AS int)::text
    WHEN (SELECT count(*) FROM mv) = 0 AND max(status) <> $1 THEN CAST('` + settledAs + `' || max(status) AS int)::text
    ELSE max(status) END AS status
  FROM ` + table + ` WHERE id = $2
), ` + cte.With + `
SELECT (SELECT count(*) FROM mv), (SELECT status FROM og_found), ` + cte.Result + asyncCol
	args := append([]any{string(outcome), id}, cte.Args...)
	for try := 1; ; try++ {
		var (
			moved, done int64
			status, off string
		)
		dest := []any{&moved, &status, &done}
		if async {
			dest = append(dest, &off)
		}
		err = s.db.QueryRowContext(ctx, q, args...).Scan(dest...)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if strings.Contains(msg, noMovement) {
			return false, "", app.ErrNotFound
		} else if _, other, ok := strings.Cut(msg, settledAs); ok {
			other, _, _ = strings.Cut(other, `"`)
			if other != string(app.Pending) {
				return false, app.Status(other), nil
			}
			if try < 3 {
				continue // settled meanwhile: read again
			}
			return false, "", fmt.Errorf("sqlstore: settle %s: still pending after its row was settled", id)
		} else if err != nil {
			return false, "", s.Records.Completed(0, err)
		}
		if err := s.Records.Completed(done, nil); err != nil {
			return moved == 1, outcome, fmt.Errorf("%w: %w", app.ErrRecordLost, err)
		}
		return moved == 1, outcome, nil
	}
}

// SettleDeposit is Settle of a deposit, succeeded or failed, with no record or event.
func (s *Store) SettleDeposit(ctx context.Context, id string, succeeded bool, now time.Time) (bool, error) {
	moved, _, err := s.Settle(ctx, app.Deposit, id, outcome(succeeded), now, nil, "")
	return moved, err
}

// SettleWithdrawal is Settle of a withdrawal, succeeded or failed, with no record or event.
func (s *Store) SettleWithdrawal(ctx context.Context, id string, succeeded bool, now time.Time) (bool, error) {
	moved, _, err := s.Settle(ctx, app.Withdrawal, id, outcome(succeeded), now, nil, "")
	return moved, err
}

func outcome(succeeded bool) app.Status {
	if succeeded {
		return app.Succeeded
	}
	return app.Failed
}

// unpend is the CTE by which a PostgreSQL statement that settles movement $2
// takes it out of the backlog (migration 008). Unconditional: a movement
// settled before is not in it any more, and a row left there by an
// instance older than the migration goes with the next attempt to settle
// it. Settle refuses a Pending outcome, which would match a pending row.
const unpend = `unpend AS (DELETE FROM pending_movements WHERE id = $2)`

// settleRow moves the pending row id of table to status and reports
// whether it did (false: settled before), with the row's status after
// and, if it was not moved or need is true, its user and amount;
// app.ErrNotFound if there is no such row.
func (s *Store) settleRow(ctx context.Context, tx *sql.Tx, table, id string, status app.Status, need bool) (moved bool, userID string, amount int64, after app.Status, err error) {
	update := `UPDATE ` + table + ` SET status = ? WHERE id = ? AND status = 'pending'`
	read := func() error {
		var st string
		err := tx.QueryRowContext(ctx, s.q(`SELECT user_id, amount, status FROM `+table+` WHERE id = ?`), id).Scan(&userID, &amount, &st)
		if errors.Is(err, sql.ErrNoRows) {
			return app.ErrNotFound
		}
		after = app.Status(st)
		return err
	}
	if s.d == sqldialect.SQLite && !need {
		// An Exec, not a RETURNING: on SQLite that costs a fifth of the
		// statement (an ephemeral table, a Rows).
		res, err := s.st.Exec(ctx, tx, update, string(status), id)
		if err != nil {
			return false, "", 0, "", err
		}
		if n, err := res.RowsAffected(); err != nil {
			return false, "", 0, "", err
		} else if n == 0 {
			err = read() // settled before, or not there
			return false, userID, amount, after, err
		}
		return true, "", 0, status, nil
	}
	if s.d != sqldialect.MySQL {
		q := s.q(update + ` RETURNING user_id, amount`)
		if s.d == sqldialect.Postgres {
			q = `WITH mv AS (` + q + `), ` + unpend + ` SELECT user_id, amount FROM mv`
		}
		err = s.st.QueryRow(ctx, tx, q, string(status), id).Scan(&userID, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			err = read() // settled before, or not there
			return false, userID, amount, after, err
		}
		return err == nil, userID, amount, status, err
	}
	// MySQL: the read locks the row, so the status read is the one the update sees.
	if err := s.readLocked(ctx, tx, table, id, &userID, &amount, &after); err != nil {
		return false, "", 0, "", err
	}
	if after != app.Pending {
		return false, userID, amount, after, nil
	}
	res, err := tx.ExecContext(ctx, update, string(status), id)
	if err != nil {
		return false, "", 0, "", err
	}
	n, err := res.RowsAffected()
	if n > 0 {
		after = status
	}
	return n > 0, userID, amount, after, err
}

// readLocked reads a movement's user, amount and status under a row lock (MySQL).
func (s *Store) readLocked(ctx context.Context, tx *sql.Tx, table, id string, userID *string, amount *int64, status *app.Status) error {
	var st string
	err := tx.QueryRowContext(ctx, `SELECT user_id, amount, status FROM `+table+` WHERE id = ? FOR UPDATE`, id).Scan(userID, amount, &st)
	if errors.Is(err, sql.ErrNoRows) {
		return app.ErrNotFound
	}
	*status = app.Status(st)
	return err
}

// FindMovement returns the deposit or withdrawal with id, whoever's it is.
func (s *Store) FindMovement(ctx context.Context, id string) (m app.Movement, err error) {
	defer s.timed("find_movement", time.Now(), &err)
	for _, k := range []app.Kind{app.Deposit, app.Withdrawal} {
		t, _ := table(k)
		m, err = scanMovement(s.db.QueryRowContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+` WHERE id = ?`), id), k)
		if !errors.Is(err, sql.ErrNoRows) {
			return m, err
		}
	}
	return app.Movement{}, app.ErrNotFound
}

func (s *Store) movementByKey(ctx context.Context, k app.Kind, userID, key string) (app.Movement, error) {
	t, err := table(k)
	if err != nil {
		return app.Movement{}, err
	}
	m, err := scanMovement(s.db.QueryRowContext(ctx, s.q(`SELECT id, user_id, idempotency_key, amount, status, created_at FROM `+t+` WHERE user_id = ? AND idempotency_key = ?`), userID, key), k)
	if errors.Is(err, sql.ErrNoRows) {
		return app.Movement{Kind: k, UserID: userID, Key: key}, app.ErrNotFound
	}
	return m, err
}
