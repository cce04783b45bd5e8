package events

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/natsjs"
	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// Metrics count what the relay does.
type Metrics interface {
	EventPublished()
	EventRetried()
	EventsPending(n int)
}

// Config configure a Relay.
type Config struct {
	URL     string // --events: nats://HOST:PORT
	DB      *sql.DB
	Dialect sqldialect.Dialect
	Metrics Metrics      // nil: none
	Logger  *slog.Logger // nil: slog.Default()
	// Relay tunes the outbox relay (nil: the service's defaults); its
	// hooks are the Relay's own.
	Relay *outbox.RelayOptions
}

// Delayed is how old the oldest unpublished event may be before /readyz
// says the events are delayed (degraded).
const Delayed = 30 * time.Second

// Relay publishes the service's outbox to JetStream. A NATS outage delays
// the events and never fails a request: the events wait in the outbox,
// and the relay retries with backoff.
type Relay struct {
	nc     *nats.Conn
	box    *outbox.Outbox
	relay  *outbox.Relay
	writer *Writer
	m      Metrics
	log    *slog.Logger

	failing atomic.Bool
}

// CheckURL refuses an --events value that is not nats://HOST:PORT.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "nats" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return fmt.Errorf("--events %q: want nats://HOST:PORT", raw)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return fmt.Errorf("--events %q: want nats://HOST:PORT", raw)
	}
	return nil
}

// Open connects to NATS (in the background when it does not answer yet:
// the service starts anyway) and makes the relay; Run runs it.
func Open(c Config) (*Relay, error) {
	if err := CheckURL(c.URL); err != nil {
		return nil, err
	}
	r := &Relay{m: c.Metrics, log: c.Logger}
	if r.log == nil {
		r.log = slog.Default()
	}
	var err error
	r.nc, err = nats.Connect(c.URL, nats.Name("onceguard"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.Timeout(2*time.Second),
		// No buffering while disconnected: a publish fails at once, and
		// the outbox keeps the event for the next attempt.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			r.log.Warn("events: NATS disconnected; events wait in the outbox", "err", fmt.Sprint(err))
		}),
		nats.ReconnectHandler(func(*nats.Conn) { r.log.Info("events: NATS reconnected") }))
	if err != nil {
		return nil, fmt.Errorf("--events: %w", err)
	}
	js, err := jetstream.New(r.nc)
	if err != nil {
		r.nc.Close()
		return nil, fmt.Errorf("--events: %w", err)
	}
	pub, err := natsjs.NewPublisher(js, &natsjs.PublisherOptions{Stream: &jetstream.StreamConfig{
		Name: Stream, Subjects: []string{Subjects}, Duplicates: natsjs.DefaultDuplicates, Storage: jetstream.FileStorage,
	}})
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	r.box, err = outbox.New(c.DB, c.Dialect, &outbox.Options{Table: Table})
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	opts := outbox.RelayOptions{MaxBackoff: 5 * time.Second}
	if c.Relay != nil {
		opts = *c.Relay
	}
	opts.OnPublished, opts.OnRetry, opts.OnPending, opts.OnError = r.published, r.retried, r.pending, r.dbError
	if r.relay, err = outbox.NewRelay(r.box, pub, &opts); err != nil {
		r.nc.Close()
		return nil, err
	}
	r.writer = &Writer{Outbox: r.box, Wake: r.relay.Wake}
	return r, nil
}

// Writer is the store's EventWriter on this relay's outbox.
func (r *Relay) Writer() *Writer { return r.writer }

// Run publishes until ctx ends.
func (r *Relay) Run(ctx context.Context) { r.relay.Run(ctx) }

// Close closes the NATS connection (after Run returned).
func (r *Relay) Close() { r.nc.Close() }

// Check is the /readyz component "events": "ok" with nothing to publish,
// "ok (N pending)" while the events flow, and degraded when events wait
// because NATS does not answer, or for longer than Delayed.
func (r *Relay) Check(ctx context.Context) (string, bool) {
	s, err := r.box.Stats(ctx)
	if err != nil {
		return "unknown (the outbox cannot be read)", false
	}
	r.pending(s)
	switch {
	case s.Pending == 0:
		return "ok", true
	case !r.nc.IsConnected():
		return fmt.Sprintf("%d pending (NATS unreachable)", s.Pending), false
	case time.Since(s.Oldest) > Delayed:
		return fmt.Sprintf("%d pending (oldest %s)", s.Pending, time.Since(s.Oldest).Round(time.Second)), false
	}
	return fmt.Sprintf("ok (%d pending)", s.Pending), true
}

func (r *Relay) published(outbox.Message) {
	if r.m != nil {
		r.m.EventPublished()
	}
	if r.failing.CompareAndSwap(true, false) {
		r.log.Info("events: publishing again")
	}
}

func (r *Relay) retried(m outbox.Message, err error, after time.Duration) {
	if r.m != nil {
		r.m.EventRetried()
	}
	// Once per outage, not per event: the relay retries every event.
	if r.failing.CompareAndSwap(false, true) {
		r.log.Warn("events: publishing failed; events wait in the outbox and are retried", "event_id", m.ID, "err", err.Error(), "retry_in", after.String())
	}
}

func (r *Relay) pending(s outbox.Stats) {
	if r.m != nil {
		r.m.EventsPending(s.Pending)
	}
}

func (r *Relay) dbError(err error) {
	r.log.Warn("events: outbox", "err", err.Error())
}
