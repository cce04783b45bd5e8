package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// A failover can lose an acknowledged lock (PITFALLS 4): the primary grants it and dies before
// its replica has it, the replica is promoted, and a second holder is granted the same lock
// while the first still believes it holds it. No lock prevents that; the fence orders the two
// holders' writes all the same: with ClockFences (the service's setting) the second holder's
// fence is above the first's, so a resource that keeps the highest fence it has seen refuses
// the first holder's write after the second's.
func TestFailoverLosesLockFenceOrdersWrites(t *testing.T) {
	ctx := context.Background()
	primary := redistest.StartServer(t, "--repl-diskless-sync-delay", "0")
	link, err := faultproxy.Start(primary.Addr()) // the replication link, to cut
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	host, port, _ := strings.Cut(link.Addr(), ":")
	replica := redistest.StartServer(t, "--replicaof", host, port)
	client := func(srv *redistest.Server) *lock.Locker {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		t.Cleanup(func() { _ = rdb.Close() })
		return lock.New(redislock.New(rdb, &redislock.Options{ClockFences: true}), nil)
	}
	first := client(primary)

	// A lease taken and released before: the replica has the lock's fence, as a replica that
	// has been in sync for a while would.
	earlier, err := first.Acquire(ctx, "account:42", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := earlier.Release(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := replica.Do("INFO", "replication")
		s, _ := info.(string)
		offset := func(s, field string) string {
			for _, l := range strings.Split(s, "\r\n") {
				if v, ok := strings.CutPrefix(l, field+":"); ok {
					return v
				}
			}
			return ""
		}
		pinfo, _ := primary.Do("INFO", "replication")
		ps, _ := pinfo.(string)
		if offset(s, "master_link_status") == "up" && offset(s, "slave_repl_offset") != "" && offset(s, "slave_repl_offset") == offset(ps, "master_repl_offset") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not catch up with the primary:\n%s", s)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The replication link breaks; the primary grants the lock and dies.
	link.ResetUntilHeal()
	held, err := first.Acquire(ctx, "account:42", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	primary.Kill(t)
	if _, err := replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}

	// The promoted replica never had the grant: a second holder gets the lock the first
	// still holds.
	second, err := client(replica).TryAcquire(ctx, "account:42", 10*time.Second)
	if err != nil {
		t.Fatalf("the second holder after the failover: %v; want the lock (the grant was lost with the primary)", err)
	}
	if held.Err() != nil {
		t.Fatalf("the first holder already knows its lease is lost: %v", held.Err())
	}

	// The resource keeps the highest fence it accepted (the account's fence <= check).
	stored := int64(0)
	write := func(fence int64) bool {
		if fence < stored {
			return false
		}
		stored = fence
		return true
	}
	if !write(second.Fence()) {
		t.Fatalf("the second holder's write (fence %d) refused", second.Fence())
	}
	if write(held.Fence()) {
		t.Errorf("the first holder's write after the second's was accepted: fences %d (first) and %d (second); want the first below the second", held.Fence(), second.Fence())
	}
}
