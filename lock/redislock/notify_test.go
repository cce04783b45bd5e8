package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/redistest"
)

// A pub/sub session whose SUBSCRIBE Redis did not confirm (its connection
// went silent: here a proxy that stalls the connections open at the time)
// is retired: the waiter that saw it polls, the next waiter gets a session
// of its own whose SUBSCRIBE is confirmed and whose wake-ups arrive, and
// each session's connection is closed when its own last waiter leaves.
// Before, every later waiter joined the silent session and polled.
func TestUnconfirmedSessionRetired(t *testing.T) {
	shared := redistest.Shared(t)
	p, err := faultproxy.Start(shared.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer rdb.Close()
	s := &subscriber{rdb: rdb}
	ctx := context.Background()
	ch := redistest.Prefix(t, shared, "og-retire")
	confirmed := func(sess *session, ch string) bool {
		s.mu.Lock()
		c := sess.chans[ch]
		s.mu.Unlock()
		if c == nil {
			return false
		}
		select {
		case <-c.confirmed:
			return true
		default:
			return false
		}
	}
	current := func() *session {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.sess
	}

	_, stop1, err := s.wait(ctx, ch+"a", "o1")
	if err != nil {
		t.Fatal(err)
	}
	first := current()
	if !confirmed(first, ch+"a") {
		t.Fatal("the first SUBSCRIBE was not confirmed")
	}
	p.Stall()
	_, stop2, err := s.wait(ctx, ch+"b", "o2") // returns after confirmTimeout, unconfirmed
	if err != nil {
		t.Fatal(err)
	}
	if confirmed(first, ch+"b") {
		t.Fatal("a SUBSCRIBE was confirmed through the stalled connection")
	}
	if current() == first {
		t.Error("new waiters still join the session whose SUBSCRIBE went unconfirmed")
	}
	wake3, stop3, err := s.wait(ctx, ch+"c", "o3")
	if err != nil {
		t.Fatal(err)
	}
	second := current()
	if second == first || second == nil {
		// (Its SUBSCRIBE's confirmation is not asserted: on a loaded
		// machine it may take longer than confirmTimeout; the wake-up
		// below is what matters.)
		t.Fatalf("the next waiter's session: the retired one %v; want a new one", second == first)
	}
	if err := shared.Publish(ctx, ch+"c", "o3").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake3:
	case <-time.After(10 * time.Second):
		t.Error("the new session's waiter was not woken by a publish")
	}
	stop1()
	stop2()
	if current() != second {
		t.Error("the retired session's last waiter leaving changed the current session")
	}
	s.mu.Lock()
	users := first.users
	s.mu.Unlock()
	if users != 0 {
		t.Errorf("the retired session has %d users after its waiters left; want 0", users)
	}
	stop3()
	if current() != nil {
		t.Error("a session is left after every waiter left")
	}
}
