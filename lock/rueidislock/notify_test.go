package rueidislock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/redistest"
)

// newSubscriber returns the subscriber of a Backend on a client of its own
// with opt (InitAddress addr, no client-side cache), closed at the end of
// the test.
func newSubscriber(t *testing.T, addr string, opt rueidis.ClientOption) *subscriber {
	t.Helper()
	opt.InitAddress, opt.DisableCache = []string{addr}, true
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return New(c, nil).subs
}

// proxiedSubscriber returns a subscriber whose client reaches the shared
// Redis through a fault proxy (closed after the client), the proxy, a
// client of that Redis direct, and a channel prefix of the test's own
// under name.
func proxiedSubscriber(t *testing.T, name string) (*subscriber, *faultproxy.Proxy, *redis.Client, string) {
	t.Helper()
	rdb := redistest.Shared(t)
	p, err := faultproxy.Start(rdb.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() }) // after the client's Close: cleanups run last first
	return newSubscriber(t, p.Addr(), rueidis.ClientOption{DisableRetry: true}), p, rdb, redistest.Prefix(t, rdb, name)
}

// stalledSession starts a waiter on ch+"a" (owner o1) through p, then
// stalls p's connections: it returns that waiter's stop and the session it
// joined, whose connection is silent from now on.
func stalledSession(t *testing.T, s *subscriber, p *faultproxy.Proxy, ch string) (stop func(), sess *session) {
	t.Helper()
	_, stop, err := s.wait(context.Background(), ch+"a", "o1")
	if err != nil {
		t.Fatal(err)
	}
	sess = s.current()
	p.Stall()
	return stop, sess
}

// current returns the session new waiters join.
func (s *subscriber) current() *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess
}

// awaitWake fails the test unless wake is signalled within 10 s.
func awaitWake(t *testing.T, wake <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Error(what)
	}
}

// A pub/sub session whose SUBSCRIBE Redis did not confirm (its connection
// went silent: here a proxy that stalls the connections open at the time)
// is retired: that waiter's wait fails (it polls), the next waiter gets a
// session of its own whose SUBSCRIBE is confirmed and whose wake-ups
// arrive, and each session's connection is closed when its own last waiter
// leaves. Before, every later waiter joined the silent session and waited
// out the confirmation's timeout, one after another.
func TestUnconfirmedSessionRetired(t *testing.T) {
	s, p, rdb, ch := proxiedSubscriber(t, "og-retire")
	ctx := context.Background()
	stop1, first := stalledSession(t, s, p, ch)
	if _, _, err := s.wait(ctx, ch+"b", "o2"); err == nil {
		t.Fatal("a SUBSCRIBE was confirmed through the stalled connection")
	}
	if s.current() == first {
		t.Error("new waiters still join the session whose SUBSCRIBE went unconfirmed")
	}
	wake3, stop3, err := s.wait(ctx, ch+"c", "o3")
	if err != nil {
		t.Fatalf("the next waiter's wait = %v; want a new session's confirmed SUBSCRIBE", err)
	}
	second := s.current()
	if second == first || second == nil {
		t.Fatalf("the next waiter's session: the retired one %v; want a new one", second == first)
	}
	if err := rdb.Publish(ctx, ch+"c", "o3").Err(); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, wake3, "the new session's waiter was not woken by a publish")
	stop1()
	s.mu.Lock()
	users, dead := first.users, first.dead
	s.mu.Unlock()
	if users != 0 || !dead {
		t.Errorf("the retired session after its waiters left: %d users, closed %v; want 0, closed", users, dead)
	}
	if s.current() != second {
		t.Error("the retired session's last waiter leaving changed the current session")
	}
	stop3()
	if s.current() != nil {
		t.Error("a session is left after every waiter left")
	}
}

// A SUBSCRIBE that Redis refuses (NOPERM: this user may use only channels
// starting og-ok) does not retire the session: a new connection would be
// refused the same, and the session's other waiters keep their
// subscriptions.
func TestRefusedSubscribeKeepsTheSession(t *testing.T) {
	srv := redistest.StartServer(t)
	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER", "limited", "on", ">pw", "~*", "+@all", "resetchannels", "&og-ok*").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s := newSubscriber(t, srv.Addr(), rueidis.ClientOption{Username: "limited", Password: "pw"})
	wake, stop, err := s.wait(ctx, "og-ok-a", "o1")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	first := s.current()
	if _, _, err := s.wait(ctx, "og-no-b", "o2"); err == nil {
		t.Fatal("a SUBSCRIBE outside the user's channels was accepted")
	} else if _, refused := rueidis.IsRedisErr(err); !refused {
		t.Fatalf("the refused SUBSCRIBE's error = %v; want Redis's refusal", err)
	}
	if s.current() != first {
		t.Error("a SUBSCRIBE Redis refused retired the session")
	}
	if err := admin.Do(ctx, admin.B().Publish().Channel("og-ok-a").Message("o1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, wake, "the session's first waiter was not woken after the refusal")
}

// The last waiter of a session to leave ends it at once, in leaveLocked,
// while it holds send: a waiter that takes send next gets a session of its
// own, not the one whose connection is about to be closed.
func TestLastLeaverEndsTheSession(t *testing.T) {
	rdb := redistest.Shared(t)
	s := newSubscriber(t, rdb.Options().Addr, rueidis.ClientOption{})
	ch := redistest.Prefix(t, rdb, "og-last")
	if _, _, err := s.wait(context.Background(), ch, "o1"); err != nil {
		t.Fatal(err)
	}
	sess := s.current()
	s.send <- struct{}{} // as its stop does
	last := s.leaveLocked(sess, ch, "o1")
	s.mu.Lock()
	after, dead := s.sess, sess.dead
	s.mu.Unlock()
	<-s.send
	sess.dc.Close()
	if !last || after != nil || !dead {
		t.Fatalf("the last waiter's leave: last %v, the session new waiters join is still it %v, ended %v; want last, none, ended", last, after == sess, dead)
	}
}

// endsAfterSelect is a context whose first Done (wait's select for the
// send slot) is open and which has ended by the next: its caller gives up
// while its SUBSCRIBE is under way.
type endsAfterSelect struct {
	context.Context
	calls       atomic.Int32
	open, ended chan struct{}
}

func newEndsAfterSelect() *endsAfterSelect {
	c := &endsAfterSelect{Context: context.Background(), open: make(chan struct{}), ended: make(chan struct{})}
	close(c.ended)
	return c
}

func (c *endsAfterSelect) Done() <-chan struct{} {
	if c.calls.Add(1) == 1 {
		return c.open
	}
	return c.ended
}

func (c *endsAfterSelect) Err() error {
	if c.calls.Load() > 1 {
		return context.Canceled
	}
	return nil
}

// A waiter whose own context ends during its SUBSCRIBE fails, and leaves
// the session as it was: the connection is healthy, and retiring it would
// cost the other waiters' session a new connection for every caller that
// gives up.
func TestCallerGivingUpKeepsTheSession(t *testing.T) {
	rdb := redistest.Shared(t)
	s := newSubscriber(t, rdb.Options().Addr, rueidis.ClientOption{})
	ctx := context.Background()
	ch := redistest.Prefix(t, rdb, "og-giveup")
	wake, stop, err := s.wait(ctx, ch+"a", "o1")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	first := s.current()

	gives := newEndsAfterSelect()
	if _, _, err := s.wait(gives, ch+"b", "o2"); err == nil {
		t.Fatal("a waiter whose context ended during SUBSCRIBE was subscribed")
	}
	if n := gives.calls.Load(); n < 2 {
		t.Fatalf("the caller's context was asked for Done %d time(s); want the SUBSCRIBE to ask after the select", n)
	}
	s.mu.Lock()
	current, dead, users := s.sess, first.dead, first.users
	s.mu.Unlock()
	if current != first || dead {
		t.Fatalf("after a caller gave up during SUBSCRIBE: the session new waiters join is the first %v, first ended %v; want the first, live", current == first, dead)
	}
	if users != 1 {
		t.Errorf("the session's waiters after the caller gave up = %d; want 1", users)
	}
	if err := rdb.Publish(ctx, ch+"a", "o1").Err(); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, wake, "the session's first waiter was not woken after another caller gave up")
}

// The last waiter of a session whose connection went silent gives up the
// send slot before it closes the connection: rueidis's Close waits for a
// PING's reply, up to a second on a silent peer, and the next waiter's
// SUBSCRIBE on a session of its own must not wait behind it.
func TestClosingASilentSessionLeavesSendFree(t *testing.T) {
	s, p, _, ch := proxiedSubscriber(t, "og-silentclose")
	ctx := context.Background()
	stop1, first := stalledSession(t, s, p, ch)
	left := make(chan struct{})
	go func() {
		defer close(left)
		stop1() // the last waiter: ends the session, then closes its silent connection
	}()
	for ended := false; !ended; {
		s.mu.Lock()
		ended = first.dead
		s.mu.Unlock()
		if !ended {
			time.Sleep(time.Millisecond)
		}
	}
	_, stop2, err := s.wait(ctx, ch+"b", "o2")
	if err != nil {
		t.Fatalf("the next waiter's wait = %v; want a new session's confirmed SUBSCRIBE", err)
	}
	select {
	case <-left:
		t.Error("the next waiter's SUBSCRIBE was confirmed only after the silent session's close: it waited for the send slot behind it")
	default:
	}
	stop2()
	<-left
}
