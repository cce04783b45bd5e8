// Package memlock is the in-process lock backend: the same semantics as the
// distributed backends (owner tokens, TTLs, fencing tokens, a fair waiter
// queue with wake-ups) for tests and single-process programs.
//
// It protects nothing across processes; use redislock or sqllock for that.
package memlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// Backend keeps locks in process memory. A zero Backend is ready to use; it
// must not be copied after first use. It is safe for concurrent use.
//
// Memory stays bounded: a key's entry is dropped once it is free with no
// waiters, and expired entries are swept every sweepEvery acquires.
type Backend struct {
	mu        sync.Mutex
	locks     map[string]*entry
	lastFence int64 // fences are unique across all keys, so entries can be dropped
	acquires  int
}

var (
	_ lock.Backend = (*Backend)(nil)
	_ lock.Waiter  = (*Backend)(nil)
)

const sweepEvery = 1024

type entry struct {
	owner   string    // "" when free
	expires time.Time // monotonic; meaningful when owner != ""
	queue   []waiter  // FIFO of blocked acquirers
	watch   map[string]chan struct{}
}

type waiter struct {
	owner   string
	expires time.Time
}

// Len returns how many keys the Backend keeps an entry for: the held ones,
// those with waiters, and expired ones not yet swept.
func (b *Backend) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.locks)
}

// Acquire implements lock.Backend.
func (b *Backend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if err := ctx.Err(); err != nil {
		return lock.Grant{}, fmt.Errorf("memlock: acquire %q: %w", r.Key, err)
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.locks == nil {
		b.locks = make(map[string]*entry)
	}
	if b.acquires++; b.acquires%sweepEvery == 0 {
		b.sweep(now)
	}
	e := b.locks[r.Key]
	if e == nil {
		e = &entry{}
		b.locks[r.Key] = e
	}
	e.expire(now)
	head := e.head(now)
	if e.owner == "" && (head == "" || head == r.Owner) {
		if head != "" {
			e.queue = e.queue[1:]
		}
		e.owner, e.expires = r.Owner, now.Add(r.TTL)
		b.lastFence = max(b.lastFence+1, time.Now().UnixMicro())
		return lock.Grant{Fence: b.lastFence}, nil
	}
	if r.Wait {
		e.enqueue(r.Owner, now.Add(r.WaitTTL))
	}
	var g lock.Grant
	if e.owner != "" {
		g.RetryAfter = e.expires.Sub(now)
	}
	return g, fmt.Errorf("memlock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
}

// Release implements lock.Backend.
func (b *Backend) Release(_ context.Context, key, owner string) error {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.locks[key]
	if err := e.check(now, owner); err != nil {
		return fmt.Errorf("memlock: release %q: %w", key, err)
	}
	e.owner = ""
	b.wakeHead(key, e, now)
	return nil
}

// Refresh implements lock.Backend.
func (b *Backend) Refresh(_ context.Context, key, owner string, ttl time.Duration) error {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.locks[key]
	if err := e.check(now, owner); err != nil {
		return fmt.Errorf("memlock: refresh %q: %w", key, err)
	}
	e.expires = now.Add(ttl)
	return nil
}

// Wait implements lock.Waiter. The subscription is in place when it returns.
func (b *Backend) Wait(_ context.Context, key, owner string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.locks == nil {
		b.locks = make(map[string]*entry)
	}
	e := b.locks[key]
	if e == nil {
		e = &entry{}
		b.locks[key] = e
	}
	if e.watch == nil {
		e.watch = make(map[string]chan struct{})
	}
	e.watch[owner] = ch
	stop := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if e := b.locks[key]; e != nil {
			delete(e.watch, owner)
			b.dropIfIdle(key, e, time.Now())
		}
	}
	return ch, stop, nil
}

// Leave implements lock.Waiter.
func (b *Backend) Leave(_ context.Context, key, owner string) error {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.locks[key]
	if e == nil {
		return nil
	}
	for i, w := range e.queue {
		if w.owner == owner {
			e.queue = append(e.queue[:i:i], e.queue[i+1:]...)
			break
		}
	}
	e.expire(now)
	if e.owner == "" {
		b.wakeHead(key, e, now)
	}
	return nil
}

// check returns nil when owner holds e at now, else ErrExpired or ErrNotHeld.
func (e *entry) check(now time.Time, owner string) error {
	if e != nil {
		e.expire(now)
	}
	switch {
	case e == nil || e.owner == "":
		return lock.ErrExpired
	case e.owner != owner:
		return lock.ErrNotHeld
	}
	return nil
}

func (e *entry) expire(now time.Time) {
	if e.owner != "" && !now.Before(e.expires) {
		e.owner = ""
	}
}

// head drops waiters that stopped renewing their place and returns the
// first live one, or "".
func (e *entry) head(now time.Time) string {
	for len(e.queue) > 0 && !now.Before(e.queue[0].expires) {
		e.queue = e.queue[1:]
	}
	if len(e.queue) == 0 {
		e.queue = nil
		return ""
	}
	return e.queue[0].owner
}

func (e *entry) enqueue(owner string, expires time.Time) {
	for i := range e.queue {
		if e.queue[i].owner == owner {
			e.queue[i].expires = expires
			return
		}
	}
	e.queue = append(e.queue, waiter{owner: owner, expires: expires})
}

// wakeHead wakes the waiter first in line, if it is watching.
func (b *Backend) wakeHead(key string, e *entry, now time.Time) {
	if h := e.head(now); h != "" {
		select {
		case e.watch[h] <- struct{}{}:
		default:
		}
	}
	b.dropIfIdle(key, e, now)
}

func (b *Backend) dropIfIdle(key string, e *entry, now time.Time) {
	e.expire(now)
	if e.owner == "" && e.head(now) == "" && len(e.watch) == 0 {
		delete(b.locks, key)
	}
}

func (b *Backend) sweep(now time.Time) {
	for k, e := range b.locks {
		b.dropIfIdle(k, e, now)
	}
}
