package natsjs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/outbox"
)

// DefaultDuplicates is the duplicates window EnsureStream gives a stream
// whose config names none: JetStream's own default is 2 minutes, shorter
// than a relay's backoff after an outage.
const DefaultDuplicates = 10 * time.Minute

// PublisherOptions configure a Publisher. A nil *PublisherOptions means
// all defaults.
type PublisherOptions struct {
	// Stream, if set, is the stream the messages must land in: each
	// publish expects it (a subject bound to no stream, or to another,
	// fails), and the Publisher ensures it (EnsureStream) before its first
	// publish and again after a publish finds no stream (a NATS server
	// restarted without its storage).
	Stream *jetstream.StreamConfig
}

// Publisher publishes outbox messages to JetStream: an outbox.Publisher.
// Each message carries its id in the Nats-Msg-Id header, so that the
// stream stores it once however often the relay publishes it inside the
// stream's duplicates window; Publish returns nil only on the stream's
// PubAck, a duplicate's included. It is safe for concurrent use.
type Publisher struct {
	js   jetstream.JetStream
	opts PublisherOptions

	mu      sync.Mutex
	ensured bool
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on js, which stays the caller's
// (jetstream.New(nc), with whatever options the caller chose).
func NewPublisher(js jetstream.JetStream, opts *PublisherOptions) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("natsjs: NewPublisher needs a jetstream.JetStream")
	}
	p := &Publisher{js: js}
	if opts != nil {
		p.opts = *opts
	}
	if s := p.opts.Stream; s != nil && s.Name == "" {
		return nil, errors.New("natsjs: PublisherOptions.Stream needs a Name")
	}
	return p, nil
}

// NewConnPublisher is NewPublisher on a JetStream context of nc, which
// stays the caller's to close.
func NewConnPublisher(nc *nats.Conn, opts *PublisherOptions) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natsjs: NewConnPublisher needs a *nats.Conn")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsjs: %w", err)
	}
	return NewPublisher(js, opts)
}

// Publish publishes m to its subject with Nats-Msg-Id = m.ID and its
// headers, and waits for the PubAck or ctx's end.
func (p *Publisher) Publish(ctx context.Context, m outbox.Message) error {
	if err := p.ensure(ctx); err != nil {
		return err
	}
	msg := nats.NewMsg(m.Subject)
	msg.Data = m.Payload
	for k, vs := range m.Headers {
		for _, v := range vs {
			msg.Header.Add(k, v)
		}
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(m.ID)}
	if s := p.opts.Stream; s != nil {
		opts = append(opts, jetstream.WithExpectStream(s.Name))
	}
	// A nil error is the stream's PubAck; one saying Duplicate is the
	// stream telling us it has the message: a success too.
	if _, err := p.js.PublishMsg(ctx, msg, opts...); err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) {
			p.mu.Lock()
			p.ensured = false // ensure it again before the next publish
			p.mu.Unlock()
		}
		return fmt.Errorf("natsjs: publish %s to %s: %w", m.ID, m.Subject, err)
	}
	return nil
}

// ensure runs EnsureStream once, if a stream is configured.
func (p *Publisher) ensure(ctx context.Context) error {
	if p.opts.Stream == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ensured {
		return nil
	}
	if _, err := EnsureStream(ctx, p.js, *p.opts.Stream); err != nil {
		return err
	}
	p.ensured = true
	return nil
}

// EnsureStream creates the stream cfg names, or, if it exists, adds what
// it lacks of cfg: its subjects and a duplicates window as long, or as
// long as the stream's MaxAge when that is shorter (JetStream allows no
// longer window). Other settings of an existing stream, and its other
// subjects, are left as they are. A zero cfg.Duplicates means
// DefaultDuplicates.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if cfg.Name == "" {
		return nil, errors.New("natsjs: EnsureStream needs a stream name")
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = DefaultDuplicates
	}
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if err != nil {
				return nil, fmt.Errorf("natsjs: create stream %s: %w", cfg.Name, err)
			}
			return s, nil
		}
		s, err = js.Stream(ctx, cfg.Name) // another process made it meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("natsjs: stream %s: %w", cfg.Name, err)
	}
	have := s.CachedInfo().Config
	want := have
	want.Subjects = slices.Clone(have.Subjects)
	for _, subj := range cfg.Subjects {
		if !slices.Contains(want.Subjects, subj) {
			want.Subjects = append(want.Subjects, subj)
		}
	}
	// JetStream refuses a window longer than the stream's MaxAge (a message
	// older than that is gone anyway): the longest it allows, not a stream
	// no event can ever be published to.
	dup := cfg.Duplicates
	if have.MaxAge > 0 {
		dup = min(dup, have.MaxAge)
	}
	want.Duplicates = max(want.Duplicates, dup)
	if len(want.Subjects) == len(have.Subjects) && want.Duplicates == have.Duplicates {
		return s, nil
	}
	s, err = js.UpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("natsjs: update stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
