package sqlstore

import (
	"context"
	"errors"
	"sync"
)

// Listener delivers PostgreSQL notifications: a LISTEN on one channel, on
// a connection of its own, which database/sql cannot do by itself. Package
// github.com/onceguard/onceguard/idempotency/pgnotify implements it on
// the pgx driver.
type Listener interface {
	// Listen starts listening on channel and returns once the LISTEN is
	// in effect; wait then calls notify with each notification's payload
	// until ctx ends or the connection fails, and returns why.
	Listen(ctx context.Context, channel string, notify func(payload string)) (wait func() error, err error)
}

// channel is the notification channel of the store's records.
func (s *Store) channel() string { return s.opts.Prefix + "idempotency" }

// notify tells the store's watchers, on PostgreSQL with a Listener, that
// record id changed; in a transaction, PostgreSQL delivers it at commit.
func (s *Store) notify(ctx context.Context, e execer, id string) error {
	if s.opts.Listener == nil {
		return nil
	}
	_, err := e.ExecContext(ctx, s.q.notify, s.channel(), id)
	return err
}

// hub fans the one LISTEN connection's notifications out to the
// watchers of each record. The connection is open while anyone watches.
type hub struct {
	mu       sync.Mutex
	watchers map[string][]chan struct{}
	cancel   context.CancelFunc // the LISTEN's, nil when none
	gen      uint64             // the LISTEN's generation
	starting chan struct{}      // closed when the LISTEN being opened is up or failed; nil when none is
}

// Watch implements idemstore.Notifier when the store has a Listener
// (Options.Listener, PostgreSQL only): Complete, CompleteTx and Abandon
// send NOTIFY with the record's id, and the channel returned is closed
// when it arrives. Without a Listener it fails, and a waiting retry polls
// the store instead.
func (s *Store) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	if s.opts.Listener == nil {
		return nil, nil, errors.New("sqlstore: watch: no Listener (Options.Listener)")
	}
	h := &s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.cancel == nil {
		// Opening the LISTEN takes a connection of the pool, which may
		// all be busy: it is done without the lock, and each watcher
		// waits for it only as long as its ctx lets it.
		if st := h.starting; st != nil {
			h.mu.Unlock()
			select {
			case <-st:
			case <-ctx.Done():
				h.mu.Lock()
				return nil, nil, wrap("watch", ctx.Err())
			}
			h.mu.Lock()
			continue
		}
		st := make(chan struct{})
		h.starting = st
		h.mu.Unlock()
		// The LISTEN outlives this watcher, but is given up with its ctx
		// while it is being opened.
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stopCancel := context.AfterFunc(ctx, cancel)
		wait, err := s.opts.Listener.Listen(lctx, s.channel(), h.deliver)
		if !stopCancel() && err == nil { // up, but cancelled meanwhile
			go func() { _ = wait() }() // it ends at once, closing its connection
			err = ctx.Err()
		}
		h.mu.Lock()
		h.starting = nil
		close(st)
		if err != nil {
			cancel()
			return nil, nil, wrap("watch", err)
		}
		h.gen++
		h.cancel = cancel
		go h.ended(h.gen, wait)
	}
	if h.watchers == nil {
		h.watchers = make(map[string][]chan struct{})
	}
	ch := make(chan struct{})
	h.watchers[id] = append(h.watchers[id], ch)
	var once sync.Once
	stop := func() { once.Do(func() { h.unwatch(id, ch) }) }
	return ch, stop, nil
}

// deliver wakes the watchers of the record id.
func (h *hub) deliver(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.watchers[id] {
		close(c)
	}
	delete(h.watchers, id)
}

func (h *hub) unwatch(id string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.watchers[id]
	for i, c := range w {
		if c == ch {
			w = append(w[:i:i], w[i+1:]...)
			break
		}
	}
	if len(w) == 0 {
		delete(h.watchers, id)
	} else {
		h.watchers[id] = w
	}
	if len(h.watchers) == 0 && h.cancel != nil {
		h.cancel()
		h.cancel = nil
	}
}

// ended runs the LISTEN of generation gen until it ends; if it ended on
// its own (a broken connection), every watcher is woken: each asks the
// store again and watches anew, on a new LISTEN.
func (h *hub) ended(gen uint64, wait func() error) {
	_ = wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != gen || h.cancel == nil {
		return // stopped: nobody watches, or a newer LISTEN runs
	}
	h.cancel()
	h.cancel = nil
	for id, w := range h.watchers {
		for _, c := range w {
			close(c)
		}
		delete(h.watchers, id)
	}
}
