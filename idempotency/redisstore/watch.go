package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// hub is Watch's: one pub/sub connection per Store, whatever the number
// of waiters, subscribed to the channel of each record someone watches
// (the record's key: its Complete and Abandon publish there), fanning
// each message out to that record's waiters. The connection is open only
// while someone watches.
type hub struct {
	mu    sync.Mutex
	ps    *redis.PubSub
	chans map[string]*watched // by channel
}

// watched is one channel's subscription and its waiters.
type watched struct {
	waiters   []chan struct{}
	confirmed chan struct{} // closed when the server confirmed the SUBSCRIBE
}

// Watch implements idemstore.Notifier with Redis pub/sub: the record's
// Complete and Abandon publish on its key, and the channel returned is
// closed on the next such message. Watch returns once the server
// confirmed the subscription, so a change after it is not missed (a
// reconnect can still lose one: the waiter polls too, slowly).
func (s *Store) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	h := &s.hub
	name := s.recKey(id)
	ch := make(chan struct{})
	h.mu.Lock()
	if h.ps == nil {
		h.ps = s.rdb.Subscribe(context.WithoutCancel(ctx))
		h.chans = make(map[string]*watched)
		go h.read(h.ps)
	}
	w := h.chans[name]
	if w == nil {
		w = &watched{confirmed: make(chan struct{})}
		h.chans[name] = w
		if err := h.ps.Subscribe(ctx, name); err != nil {
			delete(h.chans, name)
			h.closeIfIdle()
			h.mu.Unlock()
			return nil, nil, wrap("watch", err)
		}
	}
	w.waiters = append(w.waiters, ch)
	confirmed := w.confirmed
	h.mu.Unlock()
	var once sync.Once
	stop := func() { once.Do(func() { h.unwatch(ctx, name, ch) }) }
	select {
	case <-confirmed:
		return ch, stop, nil
	case <-ctx.Done():
		stop()
		return nil, nil, wrap("watch", ctx.Err())
	}
}

// read dispatches ps's confirmations and messages until ps is closed.
func (h *hub) read(ps *redis.PubSub) {
	for m := range ps.ChannelWithSubscriptions() {
		h.mu.Lock()
		if h.ps != ps { // closed, and maybe replaced: its news are not the new one's
			h.mu.Unlock()
			continue
		}
		switch m := m.(type) {
		case *redis.Subscription:
			if w := h.chans[m.Channel]; w != nil && m.Kind == "subscribe" {
				select {
				case <-w.confirmed:
				default:
					close(w.confirmed)
				}
			}
		case *redis.Message:
			if w := h.chans[m.Channel]; w != nil {
				for _, c := range w.waiters {
					close(c)
				}
				w.waiters = nil
			}
		}
		h.mu.Unlock()
	}
}

// unwatch removes the waiter ch of channel name; the last one of a
// channel unsubscribes it, the last one of all closes the connection.
func (h *hub) unwatch(ctx context.Context, name string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.chans[name]
	if w == nil {
		return
	}
	for i, c := range w.waiters {
		if c == ch {
			w.waiters = append(w.waiters[:i:i], w.waiters[i+1:]...)
			break
		}
	}
	if len(w.waiters) > 0 {
		return
	}
	delete(h.chans, name)
	if !h.closeIfIdle() {
		_ = h.ps.Unsubscribe(context.WithoutCancel(ctx), name)
	}
}

// closeIfIdle closes the connection when nobody watches; h.mu is held.
func (h *hub) closeIfIdle() bool {
	if len(h.chans) > 0 || h.ps == nil {
		return false
	}
	_ = h.ps.Close()
	h.ps, h.chans = nil, nil
	return true
}
