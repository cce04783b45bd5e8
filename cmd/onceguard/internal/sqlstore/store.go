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
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// Store runs the service's operations, one transaction each; it implements app.Store.
type Store struct {
	db *sql.DB
	d  sqldialect.Dialect
	st *sqldb.Stmts // SQLite: the hot statements prepared once; nil elsewhere
	// SQLite: the write transactions run one at a time, queued in Go, and
	// commit in groups (sqldb.WriteGate); nil elsewhere.
	gate *sqldb.WriteGate

	// Observe, if set, is told how long each operation took (op is a
	// fixed name: "withdraw", "session_user", ...). Set it before use.
	Observe func(op string, d time.Duration)
	// ObserveCommit, if set, is told on SQLite after each COMMIT of the
	// write gate how many write transactions it held and how many were
	// queued behind it (sqldb.WriteGate.OnCommit). Set it before use.
	ObserveCommit func(members, waiting int)
	// Records completes Idempotency-Key records inside settlements (nil: a
	// settlement with a record fails). Set it before use.
	Records RecordCompleter
	// Events, if set, writes an event for each deposit or withdrawal that
	// settles and each order paid, in the transaction of that change (an
	// outbox), and is told after it committed. Nil: no events. Set it
	// before use.
	Events EventWriter
	// AsyncSettle, on PostgreSQL, commits a request's settlement of a
	// withdrawal that succeeded (one statement: the status, the backlog
	// entry's removal, the key's stored answer) with synchronous_commit off
	// for that transaction: it does not wait for its WAL flush. Losing it
	// (a crash of PostgreSQL, one of its processes killed, an immediate
	// shutdown or its machine's crash, within about 3 x wal_writer_delay;
	// a failover to a standby, within the replication's lag) is losing the
	// settlement a crash of the service before it also loses: the debit's
	// commit left the movement pending in the backlog, the reconciler asks
	// the provider (paid once, under the movement's id) and settles it, and
	// the key's record, still in flight, is taken over when its lease ends
	// (a retry that finds the provider's outcome unknown then is answered
	// pending without the key keeping it: app.KeyRecord.Transient).
	// Settlements that move money back, record a provider's event or write
	// an event, and every deposit's, wait. Set it before use.
	AsyncSettle bool
	// BatchSettle, on PostgreSQL with a Records that is a ManyCompleter,
	// settles the withdrawals that succeeded which concurrent requests
	// settle at once in one statement: one round trip and one commit for
	// all that wait when it starts (at most 64; two such statements run at
	// a time). One settlement that meets no other takes the same statement:
	// a runner busy with it is what lets the next ones gather. Each answers
	// as alone; when the statement fails, nothing of it commits and each
	// settlement runs alone. Set it before use.
	BatchSettle bool
	// BatchDebit, on PostgreSQL with a Records that is a ManyStarter,
	// debits the withdrawals that concurrent requests make at once in one
	// statement: their sessions' checks, their keys' records and windows,
	// the debits and the rows, with one round trip and one commit for all
	// that wait when it starts (at most 64, of distinct users; two such
	// statements run at a time). It commits only when every one of them
	// was debited; else nothing of it commits and each runs alone, as
	// without it, which tells a refusal's reason. Withdrawals without a
	// record to create, a session to check, or with an unsigned submit
	// token run alone. Set it before use.
	BatchDebit bool
	// BatchSessions, on PostgreSQL, checks the sessions that concurrent requests check at once
	// (SessionLive) in one statement: one round trip for all that wait when it starts (at most
	// 64; two such statements run at a time); one alone takes its own statement. Each is checked
	// at its request's time, after the request arrived, so a session ended before is refused.
	// Set it before use.
	BatchSessions bool

	batch  batcher[*settleItem]
	debits batcher[*debitItem]
	lives  batcher[*liveItem]
}

// EventWriter writes the event of a state change on its transaction.
type EventWriter interface {
	// Settled writes the event of m reaching its final Status at at.
	Settled(ctx context.Context, tx *sql.Tx, m app.Movement, at time.Time) error
	// Paid writes the event of o (its Status paid) paid at at.
	Paid(ctx context.Context, tx *sql.Tx, o app.Order, at time.Time) error
	// Committed is told that a transaction with events committed.
	Committed()
}

var _ app.Store = (*Store)(nil)

// RecordCompleter creates and completes Idempotency-Key records in a
// caller's transaction or statement (idempotency/sqlstore.Store on this
// database).
type RecordCompleter interface {
	CompleteTx(ctx context.Context, tx *sql.Tx, id, lease string, resp idemstore.Response) error
	StartTx(ctx context.Context, tx *sql.Tx, st *idemstore.Start) error
	Abandon(ctx context.Context, id, lease string) error
	// PostgreSQL: composed into one statement.
	StartCTE(st *idemstore.Start, first int, after string) (idemsql.CTE, error)
	Started(ctx context.Context, st *idemstore.Start, created int64, err error) error
	CompleteCTE(id, lease string, resp idemstore.Response, first int) (idemsql.CTE, error)
	Completed(n int64, err error) error
}

// Open returns a Store on db (migrated with Migrate).
func Open(db *sql.DB, d sqldialect.Dialect) *Store {
	s := &Store{db: db, d: d}
	if d == sqldialect.SQLite {
		s.st = sqldb.NewStmts(db)
		s.gate = sqldb.NewWriteGate()
		s.gate.Watch = sqldb.SQLiteWatch // members without savepoints until one fails
		s.gate.OnCommit = func(members, waiting int) {
			if s.ObserveCommit != nil {
				s.ObserveCommit(members, waiting)
			}
		}
	}
	return s
}

// timed reports op's duration and marks *err with app.ErrUnavailable when
// the database could not answer.
func (s *Store) timed(op string, start time.Time, err *error) {
	if s.Observe != nil {
		s.Observe(op, time.Since(start))
	}
	classify(op, err)
}

// classify marks *err with app.ErrUnavailable when the database could not answer.
func classify(op string, err *error) {
	if e := *err; e != nil && !errors.Is(e, app.ErrUnavailable) && sqldb.Unavailable(e) {
		*err = fmt.Errorf("sqlstore: %s: %w: %w", op, app.ErrUnavailable, e)
	}
}

// q rewrites ? placeholders for PostgreSQL.
func (s *Store) q(query string) string {
	if s.d != sqldialect.Postgres {
		return query
	}
	return sqldb.Rebind(query)
}

// duplicate reports a unique-constraint violation, in every dialect.
func duplicate(err error) bool {
	if err == nil {
		return false
	}
	m := err.Error()
	return strings.Contains(m, "23505") || strings.Contains(m, "Error 1062") || strings.Contains(m, "UNIQUE constraint failed") ||
		strings.Contains(m, "duplicate key")
}

// us is t as stored: microseconds since the epoch.
func us(t time.Time) int64 { return t.UnixMicro() }

// at is a stored time.
func at(us int64) time.Time { return time.UnixMicro(us) }

// table is the table of a movement kind.
func table(k app.Kind) (string, error) {
	switch k {
	case app.Deposit:
		return "deposits", nil
	case app.Withdrawal:
		return "withdrawals", nil
	}
	return "", fmt.Errorf("sqlstore: no movements of kind %q", k)
}

// scanMovement reads id, user_id, idempotency_key, amount, status, created_at.
func scanMovement(sc interface{ Scan(...any) error }, k app.Kind) (app.Movement, error) {
	m := app.Movement{Kind: k}
	var amount, created int64
	var status string
	err := sc.Scan(&m.ID, &m.UserID, &m.Key, &amount, &status, &created)
	m.Amount, m.Status, m.CreatedAt = money.Amount(amount), app.Status(status), at(created)
	return m, err
}
