package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// RelayOptions configure a Relay. A nil *RelayOptions means all defaults.
type RelayOptions struct {
	// Batch is how many due rows one claim takes. Default: 100.
	Batch int
	// Lease is how long a claim keeps other relays off its rows; a relay
	// that dies holding rows delays them by up to this. Default: 30s.
	Lease time.Duration
	// PublishTimeout bounds one Publish. A batch stops claiming time when
	// less than this is left of its lease, and gives the rest of its rows
	// back, so that a row is published by its claimant alone unless a
	// Publish overran. Default: 5s, and at most Lease/2.
	PublishTimeout time.Duration
	// Poll is how often an idle relay looks for due rows (Wake looks at
	// once). Default: 250ms.
	Poll time.Duration
	// MinBackoff and MaxBackoff bound the delay before a failed publish is
	// retried: MinBackoff doubled per failed attempt, at most MaxBackoff,
	// with jitter (between half and all of it). Defaults: 100ms, 30s.
	MinBackoff, MaxBackoff time.Duration
	// Retention is how long sent rows are kept before the relay prunes
	// them. Default: 24h; negative: never pruned.
	Retention time.Duration
	// StatsEvery is how often Run counts the backlog for OnPending.
	// Default: 5s.
	StatsEvery time.Duration

	// OnPublished, if set, is told of each message acknowledged by the
	// publisher (and marked sent, or marking it failed: OnError says so).
	OnPublished func(m Message)
	// OnRetry, if set, is told of each failed publish: the message, the
	// error and the delay before the next attempt.
	OnRetry func(m Message, err error, after time.Duration)
	// OnPending, if set, is told the backlog every StatsEvery.
	OnPending func(s Stats)
	// OnError, if set, is told of the relay's database errors; the relay
	// carries on (rows whose state it could not record are retried when
	// their lease ends).
	OnError func(err error)
}

// Relay publishes an Outbox's due events through a Publisher. Several
// relays, in one process or many, may run on one table.
type Relay struct {
	o    *Outbox
	pub  Publisher
	opts RelayOptions
	wake chan struct{}
}

// NewRelay returns a relay of o's events to p.
func NewRelay(o *Outbox, p Publisher, opts *RelayOptions) (*Relay, error) {
	if o == nil || p == nil {
		return nil, errors.New("outbox: NewRelay needs an Outbox and a Publisher")
	}
	var c RelayOptions
	if opts != nil {
		c = *opts
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	def(&c.Lease, 30*time.Second)
	def(&c.PublishTimeout, 5*time.Second)
	c.PublishTimeout = min(c.PublishTimeout, c.Lease/2)
	def(&c.Poll, 250*time.Millisecond)
	def(&c.MinBackoff, 100*time.Millisecond)
	def(&c.MaxBackoff, 30*time.Second)
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	def(&c.StatsEvery, 5*time.Second)
	return &Relay{o: o, pub: p, opts: c, wake: make(chan struct{}, 1)}, nil
}

// Wake makes a running relay look for due rows now rather than at its next
// poll: call it after committing a transaction that wrote events.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run publishes due events until ctx ends. Database errors go to OnError
// and are retried with backoff; failed publishes go to OnRetry. Every
// RelayOptions.Poll (and on Wake) it claims what is due; every StatsEvery
// it counts the backlog for OnPending; it prunes sent rows older than
// Retention.
func (r *Relay) Run(ctx context.Context) {
	var lastStats, lastPrune time.Time
	errDelay := r.opts.Poll
	for {
		claimed, _, err := r.batch(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := r.opts.Poll
		switch {
		case err != nil:
			r.fail(err)
			wait, errDelay = errDelay, min(2*errDelay, r.opts.MaxBackoff)
		case claimed == r.opts.Batch:
			wait, errDelay = 0, r.opts.Poll // more may be due
		default:
			errDelay = r.opts.Poll
		}
		now := time.Now()
		if r.opts.OnPending != nil && now.Sub(lastStats) >= r.opts.StatsEvery {
			lastStats = now
			if s, err := r.o.Stats(ctx); err == nil {
				r.opts.OnPending(s)
			} else if ctx.Err() == nil {
				r.fail(err)
			}
		}
		if r.opts.Retention > 0 && now.Sub(lastPrune) >= min(r.opts.Retention/4, time.Minute) {
			lastPrune = now
			if _, err := r.o.Prune(ctx, now.Add(-r.opts.Retention), 1000); err != nil && ctx.Err() == nil {
				r.fail(err)
			}
		}
		if wait == 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// RunOnce claims one batch of due events and publishes it, and returns how
// many were published (acknowledged). A failed publish is not an error:
// the row is put back with backoff (OnRetry).
func (r *Relay) RunOnce(ctx context.Context) (published int, err error) {
	_, published, err = r.batch(ctx)
	return published, err
}

func (r *Relay) fail(err error) {
	if r.opts.OnError != nil {
		r.opts.OnError(err)
	}
}

// batch claims up to Batch due rows and publishes them in order.
func (r *Relay) batch(ctx context.Context) (claimed, published int, err error) {
	token := newToken()
	start := time.Now()
	rows, err := r.o.claim(ctx, token, start, start.Add(r.opts.Lease), r.opts.Batch)
	if err != nil && !errors.Is(err, errBadRow) {
		return 0, 0, err
	}
	if err != nil {
		r.fail(err) // the rows it could not read are put back; the rest go on
	}
	// Publishing stops when less than one PublishTimeout is left of the
	// lease: what is left goes back, due at once, for the next claim.
	stop := start.Add(r.opts.Lease - r.opts.PublishTimeout)
	for i, c := range rows {
		if ctx.Err() != nil || time.Now().After(stop) {
			r.giveBack(ctx, rows[i:], token)
			break
		}
		if r.publish(ctx, c, token) {
			published++
		}
	}
	return len(rows), published, nil
}

// publish publishes one claimed row and records the outcome; true when
// the publisher acknowledged it.
func (r *Relay) publish(ctx context.Context, c claimed, token string) bool {
	pctx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
	err := r.pub.Publish(pctx, c.m)
	cancel()
	// The outcome is recorded even when ctx ended meanwhile: a bounded
	// write, so that an ack is not thrown away.
	bg, cancelBG := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancelBG()
	if err == nil {
		if merr := r.o.markSent(bg, c, time.Now()); merr != nil {
			r.fail(fmt.Errorf("outbox: mark %s sent: %w", c.m.ID, merr))
		}
		if r.opts.OnPublished != nil {
			r.opts.OnPublished(c.m)
		}
		return true
	}
	if ctx.Err() != nil {
		// Stopping, not a failure of the message: back at once, untouched.
		r.giveBack(ctx, []claimed{c}, token)
		return false
	}
	after := r.backoff(c.m.Attempts)
	if merr := r.o.markRetry(bg, c, token, time.Now().Add(after), err.Error()); merr != nil {
		r.fail(fmt.Errorf("outbox: put %s back: %w", c.m.ID, merr))
	}
	if r.opts.OnRetry != nil {
		r.opts.OnRetry(c.m, err, after)
	}
	return false
}

// recordTimeout bounds the writes that record a publish's outcome or give
// rows back, which run even when the relay's context ended.
const recordTimeout = 10 * time.Second

// giveBack releases claimed rows unpublished, due at once.
func (r *Relay) giveBack(ctx context.Context, rows []claimed, token string) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	now := time.Now()
	for _, c := range rows {
		if err := r.o.release(bg, c, token, now); err != nil {
			r.fail(fmt.Errorf("outbox: give %s back: %w", c.m.ID, err))
			return // the leases end on their own
		}
	}
}

// backoff is the delay after the attempts-th failed publish (0: the first).
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.opts.MinBackoff
	for range min(attempts, 40) {
		if d >= r.opts.MaxBackoff {
			break
		}
		d *= 2
	}
	d = min(d, r.opts.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}
