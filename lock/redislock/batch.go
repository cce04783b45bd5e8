package redislock

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// call is one unit of work waiting for its replies: either a script run
// (s set), or plain commands sent back to back on one connection.
//
// Calls are pooled with the storage of their commands' arguments, so that
// building a command allocates only the command itself, where boxing each
// string or number in an interface would cost one allocation per argument:
// the bytes of every argument but the constant ones are appended to buf,
// and each is passed to go-redis as a pointer to an arg in args. go-redis
// reads them only while it sends the command (hooks included), which is
// before do returns; the call is not reused before its caller has read the
// replies.
type call struct {
	s     *script
	nkeys int           // of s
	cmds  []redis.Cmder // plain commands, or the script's Cmd; backed by cmdBuf

	// wake tells the caller, waiting in do, that it is handed a pipeline
	// slot (lead), at most once, and then that cmds have their replies
	// (done), in that order: a call is handed a slot only while it is
	// queued, before any flush takes it. Buffered 2, so neither send
	// blocks.
	wake chan signal

	handed bool // a slot was sent on wake; guarded by batcher.mu

	buf    []byte
	args   [8]arg
	nargs  int
	argv   [12]any // the commands' argument lists
	nargv  int
	cmdBuf [2]redis.Cmder
}

// arg is a command argument held in a call's buffer. go-redis writes it as
// an encoding.BinaryMarshaler and formats it (Cmd.String, tracing hooks,
// Cluster routing) as a fmt.Stringer: the same as the string it holds.
type arg struct{ b []byte }

// MarshalBinary returns the argument's bytes, without a copy.
func (a *arg) MarshalBinary() ([]byte, error) { return a.b, nil }

// String returns the argument as a string.
func (a *arg) String() string { return string(a.b) }

// arg returns c.buf[i:j] as a command argument.
func (c *call) arg(i, j int) any {
	a := &c.args[c.nargs]
	c.nargs++
	a.b = c.buf[i:j:j]
	return a
}

// text returns v as a command argument.
func (c *call) text(v string) any {
	i := len(c.buf)
	c.buf = append(c.buf, v...)
	return c.arg(i, len(c.buf))
}

// int returns v as a command argument.
func (c *call) int(v int64) any {
	i := len(c.buf)
	c.buf = strconv.AppendInt(c.buf, v, 10)
	return c.arg(i, len(c.buf))
}

// name appends the Redis name of key's lock + suffix to c's buffer (see
// Backend.appendName) and returns where it starts, where the lock's own
// key ends in it, and where it ends: the lock's key and one of its family
// are slices of the same bytes.
func (c *call) name(b *Backend, key, suffix string) (start, lock, end int) {
	start = len(c.buf)
	c.buf, lock = b.appendName(c.buf, key, suffix)
	return start, start + lock, len(c.buf)
}

// list copies a into c's argument lists and returns it there.
func (c *call) list(a ...any) []any {
	i := c.nargv
	c.nargv += copy(c.argv[i:], a)
	if c.nargv-i != len(a) {
		panic("redislock: too many arguments for one call")
	}
	return c.argv[i:c.nargv:c.nargv]
}

// command adds cmd, whose arguments are from list, to c.
func (c *call) command(cmd redis.Cmder) {
	if c.cmds == nil {
		c.cmds = c.cmdBuf[:0]
	}
	c.cmds = append(c.cmds, cmd)
}

// signal is what call.wake carries.
type signal uint8

const (
	lead signal = iota // the caller is handed a pipeline slot: flush
	done               // the call's commands have their replies
)

// numKeys are the numkeys arguments of EVALSHA, boxed once.
var numKeys = [...]any{"0", "1", "2", "3", "4"}

// eval makes c, a new call, a run of s on its first nkeys arguments in
// keysAndArgs (from arg, text, int), sent as EVALSHA.
func (c *call) eval(ctx context.Context, s *script, nkeys int, keysAndArgs ...any) {
	c.s, c.nkeys = s, nkeys
	c.list("evalsha", s.shaArg, numKeys[nkeys])
	c.list(keysAndArgs...)
	c.command(evalCmd(ctx, c.argv[:c.nargv:c.nargv], nkeys))
}

// evalCmd returns the command for EVALSHA or EVAL arguments a.
func evalCmd(ctx context.Context, a []any, nkeys int) *redis.Cmd {
	cmd := redis.NewCmd(ctx, a...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3) // as go-redis's own Eval: Cluster routes on the first key
	}
	return cmd
}

// resend replaces a script's Cmd that failed with NOSCRIPT by EVAL with
// the script's source and the same keys and arguments (eval made c.argv
// its argument list).
func (c *call) resend(ctx context.Context) {
	a := c.argv[:c.nargv:c.nargv]
	a[0], a[1] = "eval", c.s.srcArg
	c.cmds[0] = evalCmd(ctx, a, c.nkeys)
}

// noScript reports whether c is a script the server did not know.
func (c *call) noScript() bool {
	return c.s != nil && len(c.cmds) == 1 && isNoScript(c.cmds[0].Err())
}

// batcher pipelines concurrent calls over the caller's client: whoever
// finds a pipeline slot free sends everything queued in one round trip, and
// hands its slot to the first queued caller when it is done. No goroutine
// of its own runs, so there is nothing to close.
//
// A lock cycle costs two round trips; without pipelining, throughput under
// concurrency is bounded by round trips per connection, with it by what
// Redis executes.
type batcher struct {
	rdb         redis.UniversalClient
	maxBatch    int
	maxInflight int
	timeout     time.Duration

	mu       sync.Mutex // guards queue and inflight
	queue    []*call
	inflight int
	// shared: the last flush had company (more than one call in its batch,
	// calls left queued, or another pipeline in flight), so other callers
	// are about (see flush).
	shared atomic.Bool

	calls   sync.Pool // of *call, with their channel
	flushes sync.Pool // of *flushState
}

// flushState is what one flush reuses from the last: at most maxInflight
// are in use at once.
type flushState struct {
	pipe  redis.Pipeliner
	batch []*call
	cmds  []redis.Cmder
	again []*call
}

// get returns a call ready for do.
func (b *batcher) get() *call {
	if c, ok := b.calls.Get().(*call); ok {
		return c
	}
	return &call{wake: make(chan signal, 2)}
}

// put recycles c once its caller has read its replies.
func (b *batcher) put(c *call) {
	*c = call{wake: c.wake, buf: c.buf[:0]}
	b.calls.Put(c)
}

// do runs c and waits for its replies. It does not return before them, so
// a lock taken on the way is never lost track of; the wait is bounded by
// the batcher's timeout.
func (b *batcher) do(ctx context.Context, c *call) {
	b.mu.Lock()
	b.queue = append(b.queue, c)
	leader := b.inflight < b.maxInflight
	if leader {
		b.inflight++
	}
	b.mu.Unlock()
	if leader {
		b.flush(ctx)
	}
	// A slot handed to us must be used, or it is lost, even when another
	// flush took our call meanwhile; it comes before done.
	for <-c.wake == lead {
		b.flush(ctx)
	}
}

// flush sends one batch from the head of the queue, then hands the slot on.
func (b *batcher) flush(ctx context.Context) {
	// Under concurrency, let goroutines that are about to queue a call run
	// first, so that they join this batch: fewer, larger pipelines
	// (measured: +10% lock cycles/s at 64 goroutines). Only then: a yield
	// wakes an idle processor's thread (a futex wake, and another to put it
	// back to sleep), which a lone caller pays on every round trip for
	// nothing (measured: 4 futex calls per lock cycle at 1 goroutine).
	if b.shared.Load() {
		runtime.Gosched()
	}
	fs, _ := b.flushes.Get().(*flushState)
	if fs == nil {
		fs = &flushState{}
	}
	b.mu.Lock()
	n := min(len(b.queue), b.maxBatch)
	fs.batch = append(fs.batch[:0], b.queue[:n]...)
	b.shared.Store(n > 1 || len(b.queue) > n || b.inflight > 1)
	// Move the rest to the front, so that the queue's array is reused
	// rather than appended past and reallocated.
	m := copy(b.queue, b.queue[n:])
	clear(b.queue[m:])
	b.queue = b.queue[:m]
	b.mu.Unlock()

	if n > 0 {
		if _, dl := ctx.Deadline(); dl || ctx.Done() != nil { // else nothing ends it already: no allocation
			ctx = context.WithoutCancel(ctx)
		}
		if b.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, b.timeout)
			defer cancel()
		}
		b.exec(ctx, fs)
	}
	clear(fs.batch)
	b.flushes.Put(fs)

	b.mu.Lock()
	defer b.mu.Unlock()
	// Hand the slot to the first queued call that has none yet; if every
	// queued call already has one coming, the slot is not needed.
	for _, c := range b.queue {
		if !c.handed {
			c.handed = true
			c.wake <- lead
			return
		}
	}
	b.inflight--
}

// exec sends fs.batch and signals each call when its replies are in.
func (b *batcher) exec(ctx context.Context, fs *flushState) {
	batch := fs.batch
	if len(batch) == 1 && len(batch[0].cmds) == 1 {
		// One command: no pipeline.
		c := batch[0]
		_ = b.rdb.Process(ctx, c.cmds[0])
		if c.noScript() {
			c.resend(ctx)
			_ = b.rdb.Process(ctx, c.cmds[0])
		}
		c.wake <- done
		return
	}
	fs.cmds = fs.cmds[:0]
	for _, c := range batch {
		fs.cmds = append(fs.cmds, c.cmds...)
	}
	b.pipeline(ctx, fs, fs.cmds)
	fs.again = fs.again[:0]
	for _, c := range batch {
		if c.noScript() {
			// Script cache flushed or a new node: send the source.
			c.resend(ctx)
			fs.again = append(fs.again, c)
		}
	}
	if len(fs.again) > 0 {
		fs.cmds = fs.cmds[:0]
		for _, c := range fs.again {
			fs.cmds = append(fs.cmds, c.cmds[0])
		}
		b.pipeline(ctx, fs, fs.cmds)
		clear(fs.again)
	}
	clear(fs.cmds)
	for _, c := range batch {
		c.wake <- done
	}
}

// pipeline sends cmds in one pipeline and waits for their replies, which
// each command holds (errors included).
func (b *batcher) pipeline(ctx context.Context, fs *flushState, cmds []redis.Cmder) {
	if fs.pipe == nil {
		fs.pipe = b.rdb.Pipeline()
	}
	_ = fs.pipe.BatchProcess(ctx, cmds...)
	_, _ = fs.pipe.Exec(ctx) // empties the pipeline for the next flush
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
