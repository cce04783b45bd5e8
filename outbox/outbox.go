// Package outbox is a transactional outbox on the caller's *sql.DB
// (PostgreSQL, MySQL/MariaDB or SQLite): an event is written in the same
// *sql.Tx as the state change it reports (Outbox.Write), so that a crash
// leaves both or neither, and a Relay publishes it afterwards through a
// pluggable Publisher, marking it sent only after the publisher's ack.
// It imports no driver.
//
// Delivery is at least once, made exactly once in effect by the message
// id: a publish whose outcome is unknown (a timeout, a crash after the
// broker stored the message and before the row was marked sent, a lease
// that ran out mid-publish) is retried with the same Message.ID, which the
// Publisher must turn into an idempotent publish (NATS JetStream's
// Nats-Msg-Id deduplication does, see the natsjs module). Consumers
// deduplicate by the id beyond the broker's window.
//
// Several relays (several instances of a service) may share one table: a
// relay claims due rows with a lease (a conditional UPDATE that takes only
// rows that are unsent and due, the claim token naming the claimant; on
// PostgreSQL with SELECT ... FOR UPDATE SKIP LOCKED), so two relays
// publish the same row only when a lease ran out mid-publish. A failed
// publish puts the row back with a jittered exponential backoff. Sent rows
// are pruned after Options.Retention.
//
// Time: due times and leases use the relays' clocks (microseconds since
// the epoch), so the clocks of instances sharing a table should agree to
// well within RelayOptions.Lease.
//
// SQLite: open the file with WAL and a busy timeout, as for the other
// packages, so that relays and writers wait for each other instead of
// failing with SQLITE_BUSY.
package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// Event is what a caller writes: one message to publish.
type Event struct {
	// ID is the message's id, unique in the table: the publisher's
	// deduplication key (Nats-Msg-Id). At most 200 bytes.
	ID string
	// Subject is where the message goes (a NATS subject, a topic). At
	// most 255 bytes.
	Subject string
	// Payload is the message's body.
	Payload []byte
	// Headers are optional message headers.
	Headers map[string][]string
}

// Message is an Event as the relay hands it to a Publisher.
type Message struct {
	ID, Subject string
	Payload     []byte
	Headers     map[string][]string
	// CreatedAt is when the event was written.
	CreatedAt time.Time
	// Attempts counts the failed publishes before this one.
	Attempts int
}

// Publisher publishes one message and returns nil only once the broker
// acknowledged it. It must be idempotent by Message.ID: the relay
// publishes a message again when it cannot know whether an earlier publish
// took effect. It must return when ctx ends.
type Publisher interface {
	Publish(ctx context.Context, m Message) error
}

// PublisherFunc is a function as a Publisher.
type PublisherFunc func(ctx context.Context, m Message) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, m Message) error { return f(ctx, m) }

// ErrDuplicate is returned by Write for an event whose ID the table holds.
var ErrDuplicate = errors.New("outbox: duplicate event id")

// Options configure an Outbox. A nil *Options means all defaults.
type Options struct {
	// Table is the table's name: letters, digits and underscores.
	// Default: "onceguard_outbox".
	Table string
}

// Outbox writes events into its table and reports on it. It is safe for
// concurrent use.
type Outbox struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	table   string
	q       queries

	migrateMu sync.Mutex
	migrated  atomic.Bool
}

var tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,50}$`)

// New returns an Outbox on db, which stays the caller's. It does no I/O:
// Migrate creates the table (or create it with your own migrations, from
// Schema).
func New(db *sql.DB, dialect sqldialect.Dialect, opts *Options) (*Outbox, error) {
	if db == nil {
		return nil, errors.New("outbox: nil *sql.DB")
	}
	table := "onceguard_outbox"
	if opts != nil && opts.Table != "" {
		table = opts.Table
	}
	if !tableRE.MatchString(table) {
		return nil, fmt.Errorf("outbox: table name %q: want letters, digits and underscores", table)
	}
	if dialect < sqldialect.Postgres || dialect > sqldialect.SQLite {
		return nil, fmt.Errorf("outbox: unknown dialect %d", dialect)
	}
	return &Outbox{db: db, dialect: dialect, table: table, q: buildQueries(dialect, table)}, nil
}

// Table returns the table's name.
func (o *Outbox) Table() string { return o.table }

// Schema returns the statements that create the table and its indexes
// (each IF NOT EXISTS), for callers who keep their schema in their own
// migrations; Migrate runs them.
func Schema(dialect sqldialect.Dialect, table string) ([]string, error) {
	if !tableRE.MatchString(table) {
		return nil, fmt.Errorf("outbox: table name %q: want letters, digits and underscores", table)
	}
	if dialect < sqldialect.Postgres || dialect > sqldialect.SQLite {
		return nil, fmt.Errorf("outbox: unknown dialect %d", dialect)
	}
	return buildQueries(dialect, table).create, nil
}

// Migrate creates the table if it does not exist. It is safe to run from
// several processes at once.
func (o *Outbox) Migrate(ctx context.Context) error {
	if o.migrated.Load() {
		return nil
	}
	o.migrateMu.Lock()
	defer o.migrateMu.Unlock()
	if o.migrated.Load() {
		return nil
	}
	for _, stmt := range o.q.create {
		if err := sqldb.Create(ctx, o.db, stmt); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
	}
	o.migrated.Store(true)
	return nil
}

// Write adds events to the outbox in tx, the caller's transaction: they
// become visible to relays when tx commits, and vanish with it if it rolls
// back. An ID the table already holds fails with ErrDuplicate (and, on
// PostgreSQL, aborts tx).
func (o *Outbox) Write(ctx context.Context, tx *sql.Tx, events ...Event) error {
	now := time.Now().UnixMicro()
	for _, e := range events {
		if e.ID == "" || len(e.ID) > 200 {
			return fmt.Errorf("outbox: write: event id %q: want 1 to 200 bytes", e.ID)
		}
		if e.Subject == "" || len(e.Subject) > 255 {
			return fmt.Errorf("outbox: write %s: subject %q: want 1 to 255 bytes", e.ID, e.Subject)
		}
		var headers []byte
		if len(e.Headers) > 0 {
			var err error
			if headers, err = json.Marshal(e.Headers); err != nil {
				return fmt.Errorf("outbox: write %s: headers: %w", e.ID, err)
			}
		}
		payload := e.Payload
		if payload == nil {
			payload = []byte{}
		}
		if _, err := tx.ExecContext(ctx, o.q.insert, e.ID, e.Subject, payload, headers, now, now); err != nil {
			if duplicate(err) {
				return fmt.Errorf("outbox: write %s: %w", e.ID, ErrDuplicate)
			}
			return fmt.Errorf("outbox: write %s: %w", e.ID, err)
		}
	}
	return nil
}

// Stats describe the unsent rows.
type Stats struct {
	// Pending counts the events not yet acknowledged by the publisher.
	Pending int
	// Oldest is when the oldest of them was written (zero when none).
	Oldest time.Time
}

// Stats counts the events not yet sent: the backlog, for readiness checks
// and metrics.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	var n int
	var oldest sql.NullInt64
	if err := o.db.QueryRowContext(ctx, o.q.stats).Scan(&n, &oldest); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	s := Stats{Pending: n}
	if oldest.Valid {
		s.Oldest = time.UnixMicro(oldest.Int64)
	}
	return s, nil
}

// Prune deletes events sent before the cutoff, up to limit rows (limit <= 0:
// 1000), and returns how many it deleted. Unsent events are never deleted.
func (o *Outbox) Prune(ctx context.Context, sentBefore time.Time, limit int) (int64, error) {
	if limit <= 0 {
		limit = 1000
	}
	var n int64
	var err error
	if o.dialect == sqldialect.MySQL {
		err = o.readCommitted(ctx, o.q.prune, sentBefore.UnixMicro(), limit, &n)
	} else {
		var res sql.Result
		if res, err = o.db.ExecContext(ctx, o.q.prune, sentBefore.UnixMicro(), limit); err == nil {
			n, err = res.RowsAffected()
		}
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	return n, nil
}

// readCommitted runs one statement on MySQL in a READ COMMITTED
// transaction, whose locking reads take record locks only: under
// REPEATABLE READ the claim's and the prune's range scans would take gap
// locks, and a writer inserting its event (in a transaction holding the
// writer's own rows) would wait on them, up to a deadlock or its lock
// wait timeout. A last *int64 argument receives the rows affected.
func (o *Outbox) readCommitted(ctx context.Context, q string, args ...any) error {
	var affected *int64
	if len(args) > 0 {
		if p, ok := args[len(args)-1].(*int64); ok {
			affected, args = p, args[:len(args)-1]
		}
	}
	tx, err := o.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	if affected != nil {
		if *affected, err = res.RowsAffected(); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// claim marks up to limit due rows as claimed by token until leaseEnd and
// returns them.
func (o *Outbox) claim(ctx context.Context, token string, now, leaseEnd time.Time, limit int) ([]claimed, error) {
	var rows *sql.Rows
	var err error
	switch o.dialect {
	case sqldialect.MySQL:
		// MySQL has no UPDATE ... RETURNING: the conditional UPDATE takes
		// the rows (row locks serialise two relays; the second sees them
		// claimed), then the claim token finds them.
		if err = o.readCommitted(ctx, o.q.claim, token, leaseEnd.UnixMicro(), now.UnixMicro(), limit); err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		rows, err = o.db.QueryContext(ctx, o.q.claimed, token)
	default:
		rows, err = o.db.QueryContext(ctx, o.q.claim, token, leaseEnd.UnixMicro(), now.UnixMicro(), limit)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer rows.Close()
	var out, bad []claimed
	var badErr error
	for rows.Next() {
		var c claimed
		var headers []byte
		var created int64
		if err := rows.Scan(&c.seq, &c.m.ID, &c.m.Subject, &c.m.Payload, &headers, &c.m.Attempts, &created); err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		c.m.CreatedAt = time.UnixMicro(created)
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &c.m.Headers); err != nil {
				// One row that cannot be read must not hold up the
				// others: it is put back after the lease, with its error.
				bad = append(bad, c)
				badErr = errors.Join(badErr, fmt.Errorf("outbox: claim %s: headers: %w: %w", c.m.ID, errBadRow, err))
				continue
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	rows.Close()
	for _, c := range bad {
		if err := o.markRetry(ctx, c, token, leaseEnd, "headers: not decodable"); err != nil {
			badErr = errors.Join(badErr, fmt.Errorf("outbox: put %s back: %w", c.m.ID, err))
		}
	}
	// Oldest first; RETURNING does not promise an order.
	sortClaimed(out)
	return out, badErr
}

// errBadRow marks claim's error for rows it could not read and put back:
// the others it returns are claimed and to be published.
var errBadRow = errors.New("row not readable")

type claimed struct {
	seq int64
	m   Message
}

func sortClaimed(cs []claimed) {
	slices.SortFunc(cs, func(a, b claimed) int { return cmp.Compare(a.seq, b.seq) })
}

// markSent records the ack. It is not conditional on the claim: the
// message was published, whoever holds the row now.
func (o *Outbox) markSent(ctx context.Context, c claimed, now time.Time) error {
	return o.exec(ctx, o.q.sent, now.UnixMicro(), c.seq, c.m.ID)
}

// markRetry puts a row back, due at due, if token still holds it.
func (o *Outbox) markRetry(ctx context.Context, c claimed, token string, due time.Time, cause string) error {
	return o.exec(ctx, o.q.retry, due.UnixMicro(), truncate(cause, 500), c.seq, c.m.ID, token)
}

// release gives back a claimed row unpublished, due at once, if token holds it.
func (o *Outbox) release(ctx context.Context, c claimed, token string, now time.Time) error {
	return o.exec(ctx, o.q.release, now.UnixMicro(), c.seq, c.m.ID, token)
}

// exec runs a one-row update, again up to twice when the database could
// not run it now (a MySQL deadlock with a concurrent claim, SQLite busy):
// each is idempotent.
func (o *Outbox) exec(ctx context.Context, q string, args ...any) error {
	var err error
	for try := range 3 {
		if try > 0 {
			t := time.NewTimer(time.Duration(try*10) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
		if _, err = o.db.ExecContext(ctx, q, args...); err == nil || !sqldb.Unavailable(err) {
			return err
		}
	}
	return err
}

func newToken() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// duplicate reports a unique-constraint violation, in every dialect.
func duplicate(err error) bool {
	m := err.Error()
	return strings.Contains(m, "23505") || strings.Contains(m, "Error 1062") || strings.Contains(m, "UNIQUE constraint failed") ||
		strings.Contains(m, "duplicate key")
}
