package redislock

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock/internal/redisscript"
)

// subscriber shares one pub/sub connection among all blocked Acquires of a
// Backend. Release publishes the owner token of the first waiter in line on
// the lock's channel, and only that waiter is woken: no thundering herd.
//
// The connection exists only while someone waits: when the last waiter
// leaves it is closed, so an idle Backend holds no goroutine or connection.
// A session whose SUBSCRIBE Redis did not confirm in time (its connection
// silent: black-holed, half-open) is retired: its waiters poll and keep
// it until they leave, and the next waiter opens a new one.
type subscriber struct {
	rdb redis.UniversalClient

	mu   sync.Mutex // guards sess and every session's chans and users
	sess *session
}

type session struct {
	ps      *redis.PubSub
	chans   map[string]*channel
	users   int  // waiters across all channels
	retired bool // its SUBSCRIBE went unconfirmed: nothing more is sent on it
}

type channel struct {
	confirmed chan struct{} // closed when Redis confirmed SUBSCRIBE
	once      sync.Once
	waiters   map[string]chan struct{} // owner token -> wake
}

// wait subscribes owner on ch and returns once Redis confirmed the
// subscription (or after confirmTimeout: the caller then relies on polling).
func (s *subscriber) wait(ctx context.Context, ch, owner string) (<-chan struct{}, func(), error) {
	wake := make(chan struct{}, 1)
	s.mu.Lock()
	if s.sess == nil {
		s.sess = &session{ps: s.rdb.Subscribe(context.WithoutCancel(ctx)), chans: make(map[string]*channel)}
		go s.sess.loop(&s.mu)
	}
	sess := s.sess
	sess.users++
	c := sess.chans[ch]
	fresh := c == nil
	if fresh {
		c = &channel{confirmed: make(chan struct{}), waiters: make(map[string]chan struct{})}
		sess.chans[ch] = c
	}
	c.waiters[owner] = wake
	s.mu.Unlock()

	stop := func() { s.leave(sess, ch, owner) }
	if fresh {
		if err := sess.ps.Subscribe(ctx, ch); err != nil {
			stop()
			return nil, nil, err
		}
	}
	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	select {
	case <-c.confirmed:
	case <-t.C:
		s.retire(sess)
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
	return wake, stop, nil
}

const confirmTimeout = redisscript.ConfirmTimeout

func (s *subscriber) leave(sess *session, ch, owner string) {
	s.mu.Lock()
	c := sess.chans[ch]
	if c == nil {
		s.mu.Unlock()
		return
	}
	delete(c.waiters, owner)
	if len(c.waiters) == 0 {
		delete(sess.chans, ch)
		if !sess.retired {
			// Unsubscribing under mu keeps it ordered before a new
			// SUBSCRIBE of the same channel; it only writes to the
			// connection. A retired session gets no new SUBSCRIBE, and its
			// silent connection could block the write.
			_ = sess.ps.Unsubscribe(context.Background(), ch)
		}
	}
	sess.users--
	last := sess.users == 0
	if last && s.sess == sess {
		s.sess = nil
	}
	s.mu.Unlock()
	if last {
		// No one can join it now: closed outside mu, which the other
		// sessions' loops need.
		_ = sess.ps.Close() // ends loop
	}
}

// retire makes sess, whose SUBSCRIBE went unconfirmed, no longer the one new
// waiters join; its own waiters close it as they leave.
func (s *subscriber) retire(sess *session) {
	s.mu.Lock()
	sess.retired = true
	if s.sess == sess {
		s.sess = nil
	}
	s.mu.Unlock()
}

// loop routes confirmations and wake-ups until the connection is closed.
func (sess *session) loop(mu *sync.Mutex) {
	for msg := range sess.ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		mu.Lock()
		switch m := msg.(type) {
		case *redis.Subscription:
			if c := sess.chans[m.Channel]; c != nil && m.Kind == "subscribe" {
				c.once.Do(func() { close(c.confirmed) })
			}
		case *redis.Message:
			if c := sess.chans[m.Channel]; c != nil {
				if w := c.waiters[m.Payload]; w != nil {
					select {
					case w <- struct{}{}:
					default:
					}
				}
			}
		}
		mu.Unlock()
	}
}
