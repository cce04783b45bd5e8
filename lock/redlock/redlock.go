// Package redlock is a lock.Backend over several independent Redis nodes
// (3 or 5, not replicas of each other): a lock is held when a majority of
// nodes granted it within its validity time (TTL − elapsed − drift), so it
// survives the loss of a minority of nodes.
//
// Each node runs the scripts of package redislock (atomic owner-checked
// release and refresh, NOSCRIPT recovery, pipelining). Acquire asks all
// nodes at once; without a majority it releases whatever it got. Every
// call returns as soon as a majority succeeded, without waiting for the
// rest: a paused node costs nothing until a majority is in doubt. The
// calls to the remaining nodes go on in the background, each bounded by
// NodeTimeout, and a late grant is not left behind: a release, including
// the give-back of a failed acquire, reaches a node only after that node's
// acquire for the same owner answered or timed out, so a grant that lands
// after the caller released or gave up is undone by owner-checked delete.
// Wait blocks until such background work is done. Fences
// stay increasing across quorums: after winning, the largest fence any
// granting node returned is written back to those nodes as a floor, and
// any later majority shares at least one of them.
//
// A refresh that a majority carried re-creates the lock, with SET NX for
// the same owner and TTL, on a node that answered it had lost it (a
// restart without persistence): only while the quorum still holds, never
// over another owner's, and only after that node's earlier acquires for
// the same owner answered, so that none of their give-backs removes it.
//
// Blocked Acquires poll with jittered backoff: a per-node waiter queue
// could leave each node's first waiter different and nobody with a
// majority.
//
// The quorum does not make a paused process safe, and relies on bounded
// clock drift between nodes for expiry: as with every lock here, keep
// correctness in the resource with fencing tokens and constraints.
package redlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// Options configure a Backend. A nil *Options means all defaults.
type Options struct {
	// NodeTimeout bounds each node's answer, so that a dead node costs at
	// most this much of the TTL. Default: 250ms.
	NodeTimeout time.Duration

	// Redis configures each node's redislock.Backend (prefix, fence
	// retention, pipelining). Its Timeout is replaced by NodeTimeout.
	Redis *redislock.Options
}

// Backend implements lock.Backend over independent Redis nodes. It is safe
// for concurrent use.
type Backend struct {
	nodes  []*redislock.Backend
	quorum int
	opts   Options

	bg       sync.WaitGroup // calls still running after their operation returned
	mu       sync.Mutex
	inflight map[string][]*attempt // by key and owner: acquires some node has not answered
}

// attempt is one acquire on every node; done[i] is closed once node i
// answered or timed out, so a release on node i can wait for it.
type attempt struct {
	done []chan struct{}
	left int // nodes not yet done, under Backend.mu
}

var _ lock.Backend = (*Backend)(nil)

// New returns a Backend over clients, one per independent node; it needs
// a majority, len(clients)/2+1, for every operation. lock.New makes a
// Locker of it. It returns an error for no clients. It does not dial.
func New(clients []redis.UniversalClient, opts *Options) (*Backend, error) {
	if len(clients) == 0 {
		return nil, errors.New("redlock: no Redis nodes")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 250 * time.Millisecond
	}
	var ro redislock.Options
	if o.Redis != nil {
		ro = *o.Redis
	}
	ro.Timeout = o.NodeTimeout
	b := &Backend{quorum: len(clients)/2 + 1, opts: o, inflight: map[string][]*attempt{}}
	for _, c := range clients {
		b.nodes = append(b.nodes, redislock.New(c, &ro))
	}
	return b, nil
}

// Quorum returns how many nodes must agree.
func (b *Backend) Quorum() int { return b.quorum }

// Wait blocks until the node calls that operations left running in the
// background have finished, late grants undone included. Call it after the
// operations returned, for example before counting what is still held.
func (b *Backend) Wait() { b.bg.Wait() }

func inflightKey(key, owner string) string { return key + "\x00" + owner }

// start registers an acquire of key by owner on every node.
func (b *Backend) start(key, owner string) *attempt {
	a := &attempt{done: make([]chan struct{}, len(b.nodes)), left: len(b.nodes)}
	for i := range a.done {
		a.done[i] = make(chan struct{})
	}
	b.mu.Lock()
	k := inflightKey(key, owner)
	b.inflight[k] = append(b.inflight[k], a)
	b.mu.Unlock()
	return a
}

// finish marks node i of a as answered, forgetting a once all answered.
func (b *Backend) finish(key, owner string, a *attempt, i int) {
	close(a.done[i])
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.left--; a.left > 0 {
		return
	}
	k := inflightKey(key, owner)
	rest := slices.DeleteFunc(b.inflight[k], func(x *attempt) bool { return x == a })
	if len(rest) == 0 {
		delete(b.inflight, k)
	} else {
		b.inflight[k] = rest
	}
}

// pending returns the acquires of key by owner that some node has not
// answered yet.
func (b *Backend) pending(key, owner string) []*attempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.inflight[inflightKey(key, owner)])
}

// release releases key on every node, each after its pending acquires by
// owner answered (bounded by NodeTimeout), so a late grant is undone
// rather than left until its TTL.
func (b *Backend) release(ctx context.Context, key, owner string) []error {
	waits := b.pending(key, owner)
	return b.each(ctx, func(ctx context.Context, i int, n *redislock.Backend) error {
		if len(waits) == 0 {
			return n.Release(ctx, key, owner)
		}
		for _, a := range waits {
			<-a.done[i]
		}
		// The wait used up some of the node's time: give the release its own.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.NodeTimeout)
		defer cancel()
		return n.Release(ctx, key, owner)
	})
}

// each runs f on every node at once and returns the per-node errors as
// soon as a majority succeeded, or else once every node answered. A node
// that has not answered by then is errPending (it may still succeed, as a
// node that timed out may have): it goes on in the background, bounded by
// NodeTimeout, and what it returns is dropped. So a paused node, which
// answers nothing until its timeout, does not slow an operation that a
// majority already carried; the failure paths still hear from every node.
func (b *Backend) each(ctx context.Context, f func(ctx context.Context, i int, n *redislock.Backend) error) []error {
	type answer struct {
		i   int
		err error
	}
	answers := make(chan answer, len(b.nodes)) // buffered: a late node never blocks
	b.bg.Add(len(b.nodes))
	for i, n := range b.nodes {
		go func() {
			defer b.bg.Done()
			ctx, cancel := context.WithTimeout(ctx, b.opts.NodeTimeout)
			defer cancel()
			answers <- answer{i, f(ctx, i, n)}
		}()
	}
	errs := make([]error, len(b.nodes))
	for i := range errs {
		errs[i] = errPending
	}
	ok := 0
	for range b.nodes {
		a := <-answers
		errs[a.i] = a.err
		if a.err == nil {
			if ok++; ok >= b.quorum {
				break
			}
		}
	}
	return errs
}

// errPending marks a node that had not answered when a majority had.
var errPending = errors.New("redlock: no answer yet")

// Acquire implements lock.Backend. A split vote, where contenders each won
// some nodes and none a majority (so nobody holds the lock), is tried
// again after a short random pause, up to splitTries times in all:
// otherwise, with a node down, two contenders can each win one of the
// two left and both be told the lock is held, with nobody holding it.
func (b *Backend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	r.Wait, r.WaitTTL = false, 0 // see the package doc: no per-node queues
	for try := 1; ; try++ {
		g, err, split := b.acquire(ctx, r)
		if !split || try == splitTries || ctx.Err() != nil {
			return g, err
		}
		t := time.NewTimer(time.Duration(1+mrand.IntN(4*try)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return g, err
		case <-t.C:
		}
	}
}

// splitTries bounds Acquire's attempts on split votes.
const splitTries = 4

// acquire makes one attempt; split reports a vote that nobody won.
func (b *Backend) acquire(ctx context.Context, r lock.Request) (_ lock.Grant, _ error, split bool) {
	start := time.Now()
	// Each node's goroutine writes its own element, before it answers;
	// only answered ones are read (a late node may still write its own).
	fences := make([]int64, len(b.nodes))
	a := b.start(r.Key, r.Owner)
	errs := b.each(ctx, func(ctx context.Context, i int, n *redislock.Backend) error {
		defer b.finish(r.Key, r.Owner, a, i)
		g, err := n.Acquire(ctx, r)
		fences[i] = g.Fence
		return err
	})
	won, held, down := tally(errs)
	valid := r.TTL - time.Since(start) - r.TTL/100 - 2*time.Millisecond
	if won >= b.quorum && valid > 0 {
		var floor int64
		for i, err := range errs {
			if err == nil {
				floor = max(floor, fences[i])
			}
		}
		raised := b.each(ctx, func(ctx context.Context, _ int, n *redislock.Backend) error {
			return n.RaiseFence(ctx, r.Key, floor)
		})
		if ok, _, _ := tally(raised); ok >= b.quorum {
			return lock.Grant{Fence: floor}, nil, false
		}
		down = len(b.nodes) - b.quorum + 1
	}
	// No majority: give back what we got, on every node (a node that timed
	// out may still have granted it).
	b.release(context.WithoutCancel(ctx), r.Key, r.Owner)
	if down > len(b.nodes)-b.quorum {
		return lock.Grant{}, fmt.Errorf("redlock: acquire %q: %d of %d nodes unreachable, need %d: %w: %w",
			r.Key, down, len(b.nodes), b.quorum, lock.ErrUnavailable, firstUnavailable(errs)), false
	}
	if held == 0 && won < b.quorum {
		return lock.Grant{}, errors.Join(fmt.Errorf("redlock: acquire %q: %w", r.Key, lock.ErrNotAcquired), firstOther(errs)), false
	}
	split = won > 0 && held < b.quorum && valid > 0
	return lock.Grant{}, fmt.Errorf("redlock: acquire %q: granted by %d of %d nodes, need %d: %w", r.Key, won, len(b.nodes), b.quorum, lock.ErrNotAcquired), split
}

// Release implements lock.Backend: it releases on every node and succeeds
// when a majority released.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	return b.majority("release", key, b.release(ctx, key, owner))
}

// Refresh implements lock.Backend: it succeeds when a majority refreshed.
// A node that answered the lock was gone (it restarted without
// persistence) gets it again, for the same owner and TTL, once a majority
// refreshed, so a long-held lock's quorum does not erode node by node.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	held := make(chan bool, len(b.nodes)) // the outcome, one per node that waits for it
	earlier := b.pending(key, owner)      // a re-creation waits for them, as a release does
	a := b.start(key, owner)              // a re-creation counts as an acquire: a release waits for it
	errs := b.each(ctx, func(ctx context.Context, i int, n *redislock.Backend) error {
		err := n.Refresh(ctx, key, owner, ttl)
		if !errors.Is(err, lock.ErrExpired) {
			b.finish(key, owner, a, i)
			return err
		}
		b.bg.Add(1) // while each's own goroutine for this node still runs
		go func() {
			defer b.bg.Done()
			defer b.finish(key, owner, a, i)
			if !<-held {
				return
			}
			// An earlier acquire's answer, or its give-back of a grant
			// without a fence, must not land after the re-creation.
			for _, e := range earlier {
				<-e.done[i]
			}
			// SET NX: a node where another owner got the lock keeps it.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.NodeTimeout)
			defer cancel()
			_, _ = n.Acquire(ctx, lock.Request{Key: key, Owner: owner, TTL: ttl})
		}()
		return err
	})
	err := b.majority("refresh", key, errs)
	for range b.nodes {
		held <- err == nil
	}
	return err
}

func (b *Backend) majority(op, key string, errs []error) error {
	ok, notHeld, expired, down := 0, 0, 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, lock.ErrExpired):
			expired++
		case errors.Is(err, lock.ErrNotHeld):
			notHeld++
		case errors.Is(err, lock.ErrUnavailable):
			down++
		}
	}
	switch {
	case ok >= b.quorum:
		return nil
	case down > len(b.nodes)-b.quorum:
		return fmt.Errorf("redlock: %s %q: %d of %d nodes unreachable, need %d: %w: %w",
			op, key, down, len(b.nodes), b.quorum, lock.ErrUnavailable, firstUnavailable(errs))
	case notHeld > 0:
		return fmt.Errorf("redlock: %s %q: held by %d of %d nodes, need %d: %w", op, key, ok, len(b.nodes), b.quorum, lock.ErrNotHeld)
	}
	return fmt.Errorf("redlock: %s %q: held by %d of %d nodes, need %d: %w", op, key, ok, len(b.nodes), b.quorum, lock.ErrExpired)
}

func tally(errs []error) (ok, held, down int) {
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, lock.ErrNotAcquired):
			held++
		case errors.Is(err, lock.ErrUnavailable):
			down++
		}
	}
	return ok, held, down
}

func firstUnavailable(errs []error) error {
	for _, err := range errs {
		if errors.Is(err, lock.ErrUnavailable) {
			return err
		}
	}
	return lock.ErrUnavailable
}

func firstOther(errs []error) error {
	for _, err := range errs {
		if err != nil && !errors.Is(err, lock.ErrNotAcquired) && !errors.Is(err, lock.ErrUnavailable) {
			return err
		}
	}
	return nil
}
