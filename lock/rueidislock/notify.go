package rueidislock

import (
	"context"
	"sync"

	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/lock/internal/redisscript"
)

// subscriber shares one dedicated pub/sub connection among all blocked
// Acquires of a Backend. Release publishes the owner token of the first
// waiter in line on the lock's channel, and only that waiter is woken: no
// thundering herd.
//
// The connection exists only while someone waits: when the last waiter
// leaves it is closed, so an idle Backend holds no goroutine or connection.
// A session whose SUBSCRIBE failed or went unconfirmed is retired (see
// wait).
//
// SUBSCRIBE and UNSUBSCRIBE are sent one at a time, each decided and sent
// under send, and rueidis returns from them once Redis confirmed: the
// subscriptions on the server are always what the waiters need, and a
// waiter's subscription is in place when wait returns.
type subscriber struct {
	b    *Backend
	send chan struct{} // a one-slot semaphore: see above

	mu   sync.Mutex // guards sess and every session's fields; never held across I/O
	sess *session
}

type session struct {
	dc    rueidis.DedicatedClient
	chans map[string]map[string]chan struct{} // channel -> owner token -> wake
	users int                                 // waiters across all channels
	dead  bool                                // the connection failed, went silent or is closed
}

// confirmTimeout bounds SUBSCRIBE and UNSUBSCRIBE when Options.Timeout is
// not set.
const confirmTimeout = redisscript.ConfirmTimeout

// wait subscribes owner on ch and returns once Redis confirmed the
// subscription.
func (s *subscriber) wait(ctx context.Context, ch, owner string) (<-chan struct{}, func(), error) {
	select {
	case s.send <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	sent := false // send released early
	defer func() {
		if !sent {
			<-s.send
		}
	}()

	wake := make(chan struct{}, 1)
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	if sess == nil {
		// Only wait makes sessions, under send: no other can start now.
		sess = s.open()
		s.mu.Lock()
		s.sess = sess
		if sess.dead { // the connection failed already
			s.sess = nil
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	sess.users++
	ws := sess.chans[ch]
	fresh := ws == nil
	if fresh {
		ws = make(map[string]chan struct{})
		sess.chans[ch] = ws
	}
	ws[owner] = wake
	s.mu.Unlock()

	if fresh {
		sctx, cancel := s.context(ctx)
		err := sess.dc.Do(sctx, sess.dc.B().Subscribe().Channel(ch).Build()).Error()
		cancel()
		if err != nil {
			if _, refused := rueidis.IsRedisErr(err); !refused && ctx.Err() == nil {
				// Not confirmed, neither refused by Redis (NOPERM, say: a new
				// connection would be refused too) nor given up by the caller:
				// the connection may be silent (black-holed, half-open).
				// Retired: its waiters poll and close it as they leave, the
				// next waiter opens another, and nothing more is sent on it.
				s.mu.Lock()
				s.endLocked(sess)
				s.mu.Unlock()
			}
			sent = true
			s.leaveReleasing(sess, ch, owner)
			return nil, nil, err
		}
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			s.send <- struct{}{}
			s.leaveReleasing(sess, ch, owner)
		})
	}
	return wake, stop, nil
}

func (s *subscriber) context(ctx context.Context) (context.Context, context.CancelFunc) {
	d := s.b.timeout
	if d <= 0 {
		d = confirmTimeout
	}
	return context.WithTimeout(ctx, d)
}

// open starts a session on a dedicated connection of the client's.
func (s *subscriber) open() *session {
	dc, _ := s.b.client.Dedicate() // dc.Close, not the release func: the connection carries subscriptions
	sess := &session{dc: dc, chans: make(map[string]map[string]chan struct{})}
	errs := dc.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: func(m rueidis.PubSubMessage) { s.route(sess, m) }})
	go func() {
		// The channel yields the connection's error and closes when the
		// connection ends: waiters still on it poll; new ones get a new
		// session.
		for range errs {
		}
		s.mu.Lock()
		s.endLocked(sess)
		s.mu.Unlock()
	}()
	return sess
}

// route wakes the waiter whose token a release published. It runs on the
// connection's reading goroutine.
func (s *subscriber) route(sess *session, m rueidis.PubSubMessage) {
	s.mu.Lock()
	if w := sess.chans[m.Channel][m.Message]; w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
}

// endLocked marks sess dead and, if new waiters would join it, no longer
// the one they join; called with mu held.
func (s *subscriber) endLocked(sess *session) {
	sess.dead = true
	if s.sess == sess {
		s.sess = nil
	}
}

// leaveReleasing is leaveLocked, then releases send, then closes the
// session's connection when owner was its last waiter: a silent connection
// can take a while to close, and another session's SUBSCRIBE need not wait
// for it.
func (s *subscriber) leaveReleasing(sess *session, ch, owner string) {
	last := s.leaveLocked(sess, ch, owner)
	<-s.send
	if last {
		sess.dc.Close() // drops its subscriptions; ends its goroutines
	}
}

// leaveLocked takes owner off ch; called with send held. The last waiter
// of a channel unsubscribes it; the last of the session ends it and reports
// last, for leaveReleasing to close its connection.
func (s *subscriber) leaveLocked(sess *session, ch, owner string) (last bool) {
	s.mu.Lock()
	ws := sess.chans[ch]
	delete(ws, owner)
	unsubscribe := false
	if len(ws) == 0 {
		delete(sess.chans, ch)
		unsubscribe = !sess.dead
	}
	sess.users--
	last = sess.users == 0
	if last {
		s.endLocked(sess)
	}
	s.mu.Unlock()
	if !last && unsubscribe {
		ctx, cancel := s.context(context.Background())
		_ = sess.dc.Do(ctx, sess.dc.B().Unsubscribe().Channel(ch).Build()).Error()
		cancel()
	}
	return last
}
