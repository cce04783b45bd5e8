package lincheck

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// Kind is what an Op did.
type Kind uint8

// Operation kinds.
const (
	Acquire     Kind = iota + 1 // TryAcquire, Acquire, or one Backend.Acquire
	Release                     // Lease.Release or Backend.Release
	Write                       // the holder wrote its fence into the key's Register
	Read                        // the holder read the key's Register
	FencedWrite                 // the holder wrote its fence into the key's FencedRegister
)

func (k Kind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Release:
		return "release"
	case Write:
		return "write"
	case Read:
		return "read"
	case FencedWrite:
		return "fenced-write"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Result is an Op's outcome.
type Result uint8

// Outcomes.
const (
	OK          Result = iota // done: granted, released, written, read, accepted
	NotAcquired               // acquire refused: the lock is held (ErrNotAcquired)
	NotHeld                   // release refused: another owner holds the lock (ErrNotHeld)
	Expired                   // release refused: nobody holds the lock (ErrExpired)
	Unknown                   // failed in a way that may or may not have taken effect
	Refused                   // fenced write refused as stale
)

func (r Result) String() string {
	switch r {
	case OK:
		return "ok"
	case NotAcquired:
		return "not-acquired"
	case NotHeld:
		return "not-held"
	case Expired:
		return "expired"
	case Unknown:
		return "unknown"
	case Refused:
		return "refused"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Classify maps a lock error to a Result. An error that matches
// ErrUnavailable or a context error is Unknown even when it also matches
// ErrNotAcquired (a Locker joins them when the caller's context ended
// during an attempt): the attempt may have reached the backend.
func Classify(err error) Result {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, lock.ErrUnavailable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Unknown
	case errors.Is(err, lock.ErrNotAcquired):
		return NotAcquired
	case errors.Is(err, lock.ErrExpired):
		return Expired
	case errors.Is(err, lock.ErrNotHeld):
		return NotHeld
	}
	return Unknown
}

// Op is one recorded operation.
type Op struct {
	Client int    // the goroutine that ran it (porcupine's client id)
	Scope  string // the backend it ran on, for Backend histories; "" for a Locker's
	Key    string
	Kind   Kind
	// Owner is the lease's owner token. For an Acquire through a Locker
	// it is known only when the acquire succeeded ("" otherwise).
	Owner string
	// Call and Return are nanoseconds since the recorder was made, on the
	// monotonic clock: Call taken before the operation started, Return
	// after it completed.
	Call, Return int64
	// Fence is the fence granted (Acquire) or written (Write, FencedWrite).
	Fence int64
	// Value is what a Read returned.
	Value  int64
	Result Result
	Wait   bool  // Acquire: a blocking Acquire
	Rogue  bool  // Release: by a random owner that never held the lock
	Err    error // the error behind a Result other than OK, for reports
}

func (o Op) String() string {
	s := fmt.Sprintf("c%d %s", o.Client, o.Kind)
	if o.Scope != "" {
		s = o.Scope + " " + s
	}
	if o.Rogue {
		s += " (rogue)"
	}
	switch o.Kind {
	case Acquire:
		if o.Result == OK {
			s += fmt.Sprintf(" -> fence %d", o.Fence)
		} else {
			s += " -> " + o.Result.String()
		}
	case Release:
		s += " -> " + o.Result.String()
	case Write:
		s += fmt.Sprintf(" %d", o.Fence)
	case Read:
		s += fmt.Sprintf(" -> %d", o.Value)
	case FencedWrite:
		s += fmt.Sprintf(" %d -> %s", o.Fence, o.Result)
	}
	if o.Owner != "" {
		s += " [" + short(o.Owner) + "]"
	}
	return s + fmt.Sprintf(" @%.3fms..%.3fms", float64(o.Call)/1e6, float64(o.Return)/1e6)
}

func short(owner string) string {
	if len(owner) > 6 {
		return owner[:6]
	}
	return owner
}

// Recorder records a concurrent history. It is safe for concurrent use.
type Recorder struct {
	start time.Time

	mu      sync.Mutex
	ops     []Op
	pending map[string]int // scope -> operations called, not yet returned
}

// NewRecorder returns an empty Recorder whose clock starts now.
func NewRecorder() *Recorder {
	return &Recorder{start: time.Now(), pending: make(map[string]int)}
}

// Now returns the recorder's clock: nanoseconds since it was made.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Add records op as it is.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Ops returns a copy of the operations recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Pending returns how many operations in scope were called through
// Recorder.Backend and have not returned.
func (r *Recorder) Pending(scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending[scope]
}

func (r *Recorder) begin(scope string) int64 {
	r.mu.Lock()
	r.pending[scope]++
	r.mu.Unlock()
	return r.Now()
}

func (r *Recorder) end(scope string, op Op) {
	op.Return = r.Now()
	r.mu.Lock()
	r.pending[scope]--
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// TryAcquire runs l.TryAcquire and records it.
func (r *Recorder) TryAcquire(ctx context.Context, client int, l *lock.Locker, key string, ttl time.Duration) (*lock.Lease, error) {
	call := r.Now()
	lease, err := l.TryAcquire(ctx, key, ttl)
	r.acquired(client, key, call, lease, err, false)
	return lease, err
}

// Acquire runs the blocking l.Acquire and records it.
func (r *Recorder) Acquire(ctx context.Context, client int, l *lock.Locker, key string, ttl time.Duration) (*lock.Lease, error) {
	call := r.Now()
	lease, err := l.Acquire(ctx, key, ttl)
	r.acquired(client, key, call, lease, err, true)
	return lease, err
}

func (r *Recorder) acquired(client int, key string, call int64, lease *lock.Lease, err error, wait bool) {
	ret := r.Now()
	op := Op{Client: client, Key: key, Kind: Acquire, Call: call, Return: ret, Result: Classify(err), Wait: wait, Err: err}
	if lease != nil {
		op.Owner, op.Fence = lease.Token(), lease.Fence()
	}
	r.Add(op)
}

// Release runs lease.Release and records it.
func (r *Recorder) Release(ctx context.Context, client int, lease *lock.Lease) error {
	call := r.Now()
	err := lease.Release(ctx)
	r.Add(Op{Client: client, Key: lease.Key(), Kind: Release, Owner: lease.Token(), Call: call, Return: r.Now(), Result: Classify(err), Err: err})
	return err
}

// RogueRelease calls b.Release for key with a fresh random owner token
// that never held anything, and records it. A backend that compares the
// owner refuses it (ErrNotHeld or ErrExpired) and changes nothing.
func (r *Recorder) RogueRelease(ctx context.Context, client int, b lock.Backend, key string) error {
	owner := "rogue-" + randomToken()
	call := r.Now()
	err := b.Release(ctx, key, owner)
	r.Add(Op{Client: client, Key: key, Kind: Release, Owner: owner, Call: call, Return: r.Now(), Result: Classify(err), Rogue: true, Err: err})
	return err
}

func randomToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Register is a key's plain shared register: one atomic int64 that only the
// lock under test protects from overlapping holders.
type Register struct{ v atomic.Int64 }

// Write stores the lease's fence into reg and records it.
func (r *Recorder) Write(client int, reg *Register, lease *lock.Lease) {
	call := r.Now()
	reg.v.Store(lease.Fence())
	r.Add(Op{Client: client, Key: lease.Key(), Kind: Write, Owner: lease.Token(), Fence: lease.Fence(), Call: call, Return: r.Now()})
}

// Read loads reg and records it; it returns the value read.
func (r *Recorder) Read(client int, reg *Register, lease *lock.Lease) int64 {
	call := r.Now()
	v := reg.v.Load()
	r.Add(Op{Client: client, Key: lease.Key(), Kind: Read, Owner: lease.Token(), Value: v, Call: call, Return: r.Now()})
	return v
}

// FencedRegister is the resource side of fencing: it refuses a write whose
// fence is lower than the highest it accepted, like the service's
// "UPDATE accounts ... WHERE fence <= $fence". It is safe for concurrent
// use.
type FencedRegister struct {
	mu       sync.Mutex
	last     int64
	accepted int
	refused  int
}

// Write applies a write carrying fence: accepted when fence is at least
// the highest accepted so far.
func (f *FencedRegister) Write(fence int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fence < f.last {
		f.refused++
		return false
	}
	f.last = fence
	f.accepted++
	return true
}

// Stats returns the highest fence accepted and how many writes were
// accepted and refused.
func (f *FencedRegister) Stats() (last int64, accepted, refused int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.accepted, f.refused
}

// FencedWrite writes the lease's fence into reg and records it; it returns
// whether the write was accepted.
func (r *Recorder) FencedWrite(client int, reg *FencedRegister, lease *lock.Lease) bool {
	call := r.Now()
	ok := reg.Write(lease.Fence())
	res := OK
	if !ok {
		res = Refused
	}
	r.Add(Op{Client: client, Key: lease.Key(), Kind: FencedWrite, Owner: lease.Token(), Fence: lease.Fence(), Result: res, Call: call, Return: r.Now()})
	return ok
}

type clientKey struct{}

// WithClient tags ctx with a client id, which Recorder.Backend records for
// the calls made with it (a Locker passes the caller's context on to its
// backend, also for Release, detached but with its values).
func WithClient(ctx context.Context, client int) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

func clientOf(ctx context.Context) int {
	c, _ := ctx.Value(clientKey{}).(int)
	return c
}

// Backend wraps b so that every Acquire and Release it serves is recorded
// with Scope scope(), evaluated when the call is made: one scope per
// backend instance (a Redis restarted without its data is a new
// instance, whose history starts afresh). The context's client id
// (WithClient) is recorded as the client. Refresh, Wait and Leave pass
// through unrecorded; the result implements lock.Waiter when b does.
func (r *Recorder) Backend(b lock.Backend, scope func() string) lock.Backend {
	rb := &recBackend{r: r, b: b, scope: scope}
	if w, ok := b.(lock.Waiter); ok {
		return &recWaiter{recBackend: rb, w: w}
	}
	return rb
}

type recBackend struct {
	r     *Recorder
	b     lock.Backend
	scope func() string
}

func (rb *recBackend) Acquire(ctx context.Context, req lock.Request) (lock.Grant, error) {
	scope := rb.scope()
	call := rb.r.begin(scope)
	g, err := rb.b.Acquire(ctx, req)
	op := Op{Client: clientOf(ctx), Scope: scope, Key: req.Key, Kind: Acquire, Owner: req.Owner, Call: call, Result: Classify(err), Wait: req.Wait, Err: err}
	if op.Result == OK {
		op.Fence = g.Fence
	}
	rb.r.end(scope, op)
	return g, err
}

func (rb *recBackend) Release(ctx context.Context, key, owner string) error {
	scope := rb.scope()
	call := rb.r.begin(scope)
	err := rb.b.Release(ctx, key, owner)
	rb.r.end(scope, Op{Client: clientOf(ctx), Scope: scope, Key: key, Kind: Release, Owner: owner, Call: call, Result: Classify(err), Err: err})
	return err
}

func (rb *recBackend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return rb.b.Refresh(ctx, key, owner, ttl)
}

type recWaiter struct {
	*recBackend
	w lock.Waiter
}

func (rw *recWaiter) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	return rw.w.Wait(ctx, key, owner)
}

func (rw *recWaiter) Leave(ctx context.Context, key, owner string) error {
	return rw.w.Leave(ctx, key, owner)
}

var (
	_ lock.Backend = (*recBackend)(nil)
	_ lock.Waiter  = (*recWaiter)(nil)
)
