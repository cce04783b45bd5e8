package natsjs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
)

// An Inbox processes JetStream messages once each, in the caller's SQL
// database: a message's effect and the record of its id commit in one
// transaction (sqlstore.Store.OnceTx), and the message is acknowledged only
// after that commit. A redelivery of a message already processed (its ack
// was lost, the process died between commit and ack, the publisher sent
// it twice under one id) is acknowledged without running the handler, so
// nothing is done twice whatever crashes or redeliveries happen.
//
// Store and Source are required; the other fields may be left zero. An
// Inbox is safe for concurrent use: several goroutines, or processes, may
// consume one JetStream consumer with the same Inbox settings.
type Inbox struct {
	// Store records the message ids. It must be on the database the
	// handler writes to: the handler's *sql.Tx is a transaction of it.
	Store *sqlstore.Store
	// Source names the namespace of message ids: one per consuming
	// application (and stream), such as "billing/ONCEGUARD". Two
	// applications sharing one Store need two sources, or each would skip
	// the messages the other processed. It does not depend on the
	// JetStream consumer's name, so that an ephemeral or renamed consumer
	// still skips what was processed.
	Source string
	// ID returns a message's id. Default: MsgID.
	ID func(msg jetstream.Msg) (string, error)
	// Lease and TTL are idempotency.DoOptions': how long a delivery holds
	// its message before a redelivery may take it over (default 30s; keep
	// it above what the handler takes and below the consumer's AckWait
	// times its MaxDeliver), and how long processed ids are remembered
	// (default 24h; keep it above how long the stream may redeliver or a
	// publisher may republish).
	Lease, TTL time.Duration
	// Backoff is the delay of a nak, for a message whose handler failed or
	// that another delivery holds, given how often it was delivered (1 for
	// the first delivery). Default: 100ms doubled each time, at most 30s.
	// A message another delivery holds is nak'ed for at least Lease, so
	// that its redelivery comes once the holder has committed or its
	// lease has run out, and does not spend the consumer's MaxDeliver.
	Backoff func(delivered uint64) time.Duration
	// OnError, if set, is told what Consume could not process (msg is nil
	// for an error fetching messages); Process returns it instead.
	OnError func(msg jetstream.Msg, err error)
}

// A Handler acts on one message inside tx, which commits when it returns
// nil. It must not acknowledge msg: the Inbox does, after the commit.
type Handler func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error

// ErrNoID: a message has no id to be processed once by (Inbox.ID failed,
// or the message is not a JetStream message).
var ErrNoID = errors.New("natsjs: message without an id")

// MsgID is the default Inbox.ID: the message's Nats-Msg-Id header, the id
// its publisher gave it (an outbox publishes each event with its event id
// there, see onceguard's events), or, without one, "<stream>#<stream
// sequence>". A stream sequence identifies a message only as long as its
// stream is not deleted and re-created (sequences start over, and new
// messages would be taken for processed ones): publish with Nats-Msg-Id,
// or set Inbox.ID, where that can happen.
func MsgID(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	md, err := msg.Metadata()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoID, err)
	}
	return md.Stream + "#" + strconv.FormatUint(md.Sequence.Stream, 10), nil
}

// Process processes one message once: it runs h in a transaction of the
// Store's database that also records the message's id, and acks msg after
// the commit (ran is true). A message processed before is acked without
// running h (ran false, err nil). If h fails, the transaction rolls back
// and msg is nak'ed with Backoff's delay for a redelivery, as it is when
// another delivery holds it now (idempotency.ErrInProgress), then for at
// least Lease; the error is
// returned. A message without an id (ErrNoID) is terminated: no
// redelivery could process it once. An error acking a processed message
// is returned too; its redelivery will be acked without running h.
func (in *Inbox) Process(ctx context.Context, msg jetstream.Msg, h Handler) (ran bool, err error) {
	if in.Store == nil || in.Source == "" {
		return false, errors.New("natsjs: Inbox needs a Store and a Source")
	}
	idOf := in.ID
	if idOf == nil {
		idOf = MsgID
	}
	id, err := idOf(msg)
	if err == nil && id == "" {
		err = ErrNoID
	}
	if err != nil {
		if !errors.Is(err, ErrNoID) {
			err = fmt.Errorf("%w: %w", ErrNoID, err)
		}
		_ = msg.Term()
		return false, err
	}
	ran, err = in.Store.OnceTx(ctx, in.Source, id, &idempotency.DoOptions{Lease: in.Lease, TTL: in.TTL},
		func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, msg) })
	if err != nil {
		var delivered uint64 = 1
		if md, mdErr := msg.Metadata(); mdErr == nil {
			delivered = md.NumDelivered
		}
		delay := in.backoff(delivered)
		if errors.Is(err, idempotency.ErrInProgress) {
			// Another delivery holds the message until its lease ends: it
			// commits (and acks) before then, or it died and the message
			// may be taken over after. A redelivery sooner finds it held
			// again, and each such nak spends one of the consumer's
			// MaxDeliver: at 100 ms, 200 ms, 400 ms... a message whose
			// holder died would be dropped before its lease ran out.
			delay = max(delay, in.lease())
		}
		_ = msg.NakWithDelay(delay)
		return false, fmt.Errorf("natsjs: message %s: %w", id, err)
	}
	if err := msg.Ack(); err != nil {
		return ran, fmt.Errorf("natsjs: message %s processed, its ack failed: %w", id, err)
	}
	return ran, nil
}

// lease is Lease, or Do's default.
func (in *Inbox) lease() time.Duration {
	if in.Lease > 0 {
		return in.Lease
	}
	return idempotency.DefaultLease
}

func (in *Inbox) backoff(delivered uint64) time.Duration {
	if in.Backoff != nil {
		return in.Backoff(delivered)
	}
	d := 100 * time.Millisecond
	for i := uint64(1); i < delivered && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// Consume processes cons's messages one at a time with Process until ctx
// ends, then returns nil. It takes the caller's pull consumer as it is
// (created with jetstream.New(nc) and Stream.Consumer or
// CreateOrUpdateConsumer, durable or not); opts are cons.Messages'.
// Errors processing a message go to OnError and do not stop it, nor do
// transient fetch errors (a missed heartbeat); it returns an error if the
// connection is closed or the iterator cannot be had. For messages in
// parallel, run Consume in several goroutines on one consumer.
func (in *Inbox) Consume(ctx context.Context, cons jetstream.Consumer, h Handler, opts ...jetstream.PullMessagesOpt) error {
	if in.Store == nil || in.Source == "" {
		return errors.New("natsjs: Inbox needs a Store and a Source")
	}
	it, err := cons.Messages(opts...)
	if err != nil {
		return fmt.Errorf("natsjs: consume: %w", err)
	}
	defer it.Stop()
	pause := 50 * time.Millisecond
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			if msg != nil {
				_ = msg.Nak()
			}
			return nil
		}
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConnectionClosed) {
			return fmt.Errorf("natsjs: consume: %w", err)
		}
		if err != nil {
			in.report(nil, err)
			select { // not a busy loop while the server is away
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
			pause = min(2*pause, 5*time.Second)
			continue
		}
		pause = 50 * time.Millisecond
		if _, err := in.Process(ctx, msg, h); err != nil {
			in.report(msg, err)
		}
	}
}

func (in *Inbox) report(msg jetstream.Msg, err error) {
	if in.OnError != nil {
		in.OnError(msg, err)
	}
}
