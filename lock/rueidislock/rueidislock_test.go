package rueidislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/internal/redisscript"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/redislock"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	leakcheck.VerifyTestMain(m, leakcheck.IgnoreTopFunction(redistest.SpawnerFunction),
		// A Cluster client whose topology refresh replaced connections
		// closes the old ones 5s later, in a goroutine of its own: bounded,
		// and rueidis's, not ours. Seen when the package ends soon after
		// the Cluster test.
		leakcheck.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// clientLeaks are the goroutines a rueidis client starts for itself while
// a subtest runs: a connection switches to pipelining goroutines once
// calls overlap, and keeps them until the client is closed.
var clientLeaks = []string{
	"github.com/redis/rueidis.(*pipe)._background",
	"github.com/redis/rueidis.(*pipe)._backgroundWrite",
	"github.com/redis/rueidis.(*pipe)._backgroundRead",
}

// shared returns a rueidis client on the Redis named by
// ONCEGUARD_TEST_REDIS, or skips the test when it is unset.
func shared(t testing.TB) rueidis.Client {
	t.Helper()
	redistest.Shared(t) // skips without ONCEGUARD_TEST_REDIS, checks PING
	opt, err := rueidis.ParseURL(os.Getenv("ONCEGUARD_TEST_REDIS"))
	if err != nil {
		t.Fatalf("ParseURL = %v", err)
	}
	return newClient(t, opt)
}

func newClient(t testing.TB, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("rueidis.NewClient = %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func ownRedis(t *testing.T) (*redistest.Server, rueidis.Client) {
	t.Helper()
	srv := redistest.StartServer(t)
	c := newClient(t, rueidis.ClientOption{
		InitAddress:      []string{srv.Addr()},
		Dialer:           net.Dialer{Timeout: time.Second},
		ConnWriteTimeout: 2 * time.Second,
	})
	return srv, c
}

func TestConformance(t *testing.T) {
	c := shared(t)
	locktest.Run(t, func(*testing.T) lock.Backend { return rueidislock.New(c, nil) }, clientLeaks...)
}

func TestConformanceClockFences(t *testing.T) {
	c := shared(t)
	locktest.Run(t, func(*testing.T) lock.Backend {
		return rueidislock.New(c, &rueidislock.Options{ClockFences: true})
	}, clientLeaks...)
}

// Without auto-pipelining every call takes a connection of its own.
func TestConformanceWithoutAutoPipelining(t *testing.T) {
	redistest.Shared(t)
	opt, err := rueidis.ParseURL(os.Getenv("ONCEGUARD_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableAutoPipelining = true
	opt.DisableCache = true
	c := newClient(t, opt)
	locktest.Run(t, func(*testing.T) lock.Backend { return rueidislock.New(c, nil) }, clientLeaks...)
}

func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	c := newClient(t, rueidis.ClientOption{InitAddress: cl.Addrs()})
	locktest.Run(t, func(*testing.T) lock.Backend { return rueidislock.New(c, nil) }, clientLeaks...)

	// Many keys spread over all slots, concurrently.
	l := lock.New(rueidislock.New(c, nil), nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				// A TTL no stall reaches: this checks the slot split, not
				// expiry (redislock's same loop once took over a second
				// under load: 64 goroutines, three servers, -race).
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("cluster/%d/%d/%d", time.Now().UnixNano(), i, j), time.Minute)
				if err != nil {
					t.Errorf("TryAcquire on the cluster = %v", err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					t.Errorf("Release on the cluster = %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A redislock process and a rueidislock process on one Redis exclude each
// other, see each other's fences and wake each other's waiters: they speak
// one protocol.
func TestInteropWithRedislock(t *testing.T) {
	c := shared(t)
	rdb := redistest.Shared(t)
	ctx := context.Background()
	lockers := []*lock.Locker{lock.New(redislock.New(rdb, nil), nil), lock.New(rueidislock.New(c, nil), nil)}
	names := []string{"redislock", "rueidislock"}
	for _, clock := range []bool{false, true} {
		if clock {
			lockers = []*lock.Locker{
				lock.New(redislock.New(rdb, &redislock.Options{ClockFences: true}), nil),
				lock.New(rueidislock.New(c, &rueidislock.Options{ClockFences: true}), nil),
			}
		}
		key := fmt.Sprintf("interop/%v/%d", clock, time.Now().UnixNano())
		var last int64
		for i := range 40 {
			a, b := i%2, (i+1)%2
			if i%3 == 0 {
				a, b = b, a
			}
			lease, err := lockers[a].TryAcquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatalf("clock=%v #%d: %s TryAcquire = %v", clock, i, names[a], err)
			}
			if lease.Fence() <= last {
				t.Fatalf("clock=%v #%d: %s fence %d after %d; want increasing", clock, i, names[a], lease.Fence(), last)
			}
			last = lease.Fence()
			if _, err := lockers[b].TryAcquire(ctx, key, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("clock=%v #%d: %s TryAcquire while %s holds = %v; want ErrNotAcquired", clock, i, names[b], names[a], err)
			}
			if err := lockers[b].Backend().Release(ctx, key, "someone-else"); !errors.Is(err, lock.ErrNotHeld) {
				t.Errorf("clock=%v #%d: %s release by a non-owner = %v; want ErrNotHeld", clock, i, names[b], err)
			}
			if err := lockers[b].Backend().Refresh(ctx, key, lease.Token(), 10*time.Second); err != nil {
				t.Errorf("clock=%v #%d: %s refresh of %s's lock by its owner = %v", clock, i, names[b], names[a], err)
			}
			if i%4 == 0 {
				// The other side releases it for the owner: same script.
				err = lockers[b].Backend().Release(ctx, key, lease.Token())
			} else {
				err = lease.Release(ctx)
			}
			if err != nil {
				t.Fatalf("clock=%v #%d: Release = %v", clock, i, err)
			}
		}
	}

	// Blocked waiters of one backend are woken by releases of the other,
	// long before the holder's TTL, in either direction. The waiter's
	// MaxBackoff is 30s (its polls are at least 15s apart, past its 10s
	// wait): only a wake-up gives it the lock in time. A wall-clock bound
	// on the wake-up (200ms) failed under load, and a sleep stood in for
	// the waiter's subscription; it now waits for the waiter's second
	// attempt, the one made after subscribing.
	backends := []lock.Backend{redislock.New(rdb, nil), rueidislock.New(c, nil)}
	for a := range 2 {
		b := 1 - a
		key := fmt.Sprintf("interop/wake/%d/%d", a, time.Now().UnixNano())
		holder, err := lockers[a].TryAcquire(ctx, key, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		w := redistest.CountAcquires(t, backends[b])
		waiter := lock.New(w, &lock.Options{MaxBackoff: 30 * time.Second})
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			lease, err := waiter.Acquire(wctx, key, 10*time.Second)
			if err == nil {
				if lease.Fence() <= holder.Fence() {
					err = fmt.Errorf("fence %d after %d", lease.Fence(), holder.Fence())
				}
				_ = lease.Release(ctx)
			}
			got <- err
		}()
		// Tried, subscribed, tried again: queued and listening.
		for deadline := time.Now().Add(30 * time.Second); w.Attempts.Load() < 2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s waiter made %d attempts in 30s; want 2", names[b], w.Attempts.Load())
			}
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Errorf("%s waiter after %s release = %v; want woken by the release", names[b], names[a], err)
		}
	}
}

// A script cache lost mid-run (restart, failover, SCRIPT FLUSH) must not
// fail a call: EVALSHA falls back to EVAL.
func TestScriptFlush(t *testing.T) {
	srv, c := ownRedis(t)
	l := lock.New(rueidislock.New(c, nil), nil)
	ctx := context.Background()
	for i := range 3 {
		if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
			t.Fatalf("SCRIPT FLUSH = %v", err)
		}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("flush/%d/%d", i, g), time.Second)
				if err != nil {
					t.Errorf("TryAcquire after SCRIPT FLUSH = %v; want a lease", err)
					return
				}
				if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
					t.Errorf("SCRIPT FLUSH = %v", err)
				}
				if err := lease.Release(ctx); err != nil {
					t.Errorf("Release after SCRIPT FLUSH = %v; want nil", err)
				}
			}()
		}
		wg.Wait()
	}
}

// The script paths a try and a release do not take (a refresh, a
// blocking acquire, a waiter's handover) survive a lost script cache too.
func TestScriptFlushOtherPaths(t *testing.T) {
	srv, c := ownRedis(t)
	redistest.ScriptFlushPaths(t, rueidislock.New(c, nil), func() error {
		_, err := srv.Do("SCRIPT", "FLUSH")
		return err
	})
}

func TestUnavailable(t *testing.T) {
	srv, c := ownRedis(t)
	l := lock.New(rueidislock.New(c, &rueidislock.Options{Timeout: 500 * time.Millisecond}), nil)
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, "down", 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire = %v", err)
	}
	// A server that stops answering gives ErrUnavailable after Timeout,
	// not a hang.
	srv.Pause(t)
	if _, err := l.TryAcquire(ctx, "other", time.Second); !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("TryAcquire with Redis paused = %v; want ErrUnavailable", err)
	}
	srv.Resume(t)
	srv.Kill(t)
	if _, err := l.TryAcquire(ctx, "other", time.Second); !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("TryAcquire with Redis down = %v; want ErrUnavailable", err)
	}
	if _, err := l.Acquire(ctx, "other", time.Second); !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("Acquire with Redis down = %v; want ErrUnavailable", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("Release with Redis down = %v; want ErrUnavailable", err)
	}
	srv.Restart(t) // all lock state lost
	var lease2 *lock.Lease
	for range 50 { // the client reconnects on its own
		if lease2, err = l.TryAcquire(ctx, "down", time.Second); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("TryAcquire after restart = %v; want a lease", err)
	}
	if lease2.Fence() <= lease.Fence() {
		t.Errorf("fence after Redis lost its data = %d; want > %d (time-based fences survive)", lease2.Fence(), lease.Fence())
	}
	if err := lease2.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// The key names are redislock's (see package redisscript).
func TestKeyNaming(t *testing.T) {
	srv, c := ownRedis(t)
	l := lock.New(rueidislock.New(c, nil), nil)
	ctx := context.Background()
	for _, key := range []string{"order:42", "a{b}c", "}", "{"} {
		lease, err := l.TryAcquire(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire(%q) = %v", key, err)
		}
		if _, err := l.TryAcquire(ctx, key, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
			t.Errorf("second TryAcquire(%q) = %v; want ErrNotAcquired", key, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("Release(%q) = %v", key, err)
		}
	}
	lease, err := l.TryAcquire(ctx, "order:42", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := srv.Do("GET", "onceguard:lock:{order:42}"); err != nil || got != lease.Token() {
		t.Errorf("GET onceguard:lock:{order:42} = %v, %v; want the owner token %q", got, err, lease.Token())
	}
	if got, err := srv.Do("EXISTS", "onceguard:lock:{order:42}:fence"); err != nil || got != int64(1) {
		t.Errorf("EXISTS onceguard:lock:{order:42}:fence = %v, %v; want 1", got, err)
	}
	_ = lease.Release(ctx)
}

// A waiter that died keeps its place only until its WaitTTL: the next
// waiter is then served, in arrival order.
func TestFairQueueOrder(t *testing.T) {
	_, c := ownRedis(t)
	l := lock.New(rueidislock.New(c, nil), nil)
	ctx := context.Background()
	holder, err := l.TryAcquire(ctx, "fair", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 5)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(ctx, "fair", 30*time.Second)
			if err != nil {
				t.Errorf("Acquire = %v", err)
				return
			}
			order <- i
			time.Sleep(5 * time.Millisecond)
			_ = lease.Release(ctx)
		}()
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := l.TryAcquire(ctx, "fair", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire with waiters queued = %v; want ErrNotAcquired", err)
	}
	_ = holder.Release(ctx)
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Errorf("waiter %d served in position %d; want arrival order", got, want)
		}
		want++
	}
}

// A fence key left unseeded (its INCR created it, then the reseed failed:
// in CI this test's TestUnavailable once got fence 2 after a restart) is
// reseeded by the next try, not counted up from where it stands.
func TestUnseededFenceReseeded(t *testing.T) {
	srv, c := ownRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	redistest.UnseededFence(t, rdb, lock.New(rueidislock.New(c, nil), nil), redisscript.Name(redisscript.DefaultPrefix, "k", redisscript.FenceSuffix))
}
