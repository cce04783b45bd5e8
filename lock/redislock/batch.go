package redislock

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// call is one script run waiting for its reply.
type call struct {
	s    *script
	keys []string
	args []any
	res  any
	err  error
	done chan struct{} // closed when res/err are set
	lead chan struct{} // buffered 1: this caller is handed a pipeline slot

	handed bool // a slot was sent on lead; guarded by batcher.mu
}

// batcher pipelines concurrent script calls over the caller's client:
// whoever finds a pipeline slot free sends everything queued in one round
// trip, and hands its slot to the first queued caller when it is done. No
// goroutine of its own runs, so there is nothing to close.
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
}

// do runs c and waits for its reply. It does not return before the reply,
// so a lock taken on the way is never lost track of; the wait is bounded by
// the batcher's timeout.
func (b *batcher) do(ctx context.Context, c *call) {
	c.done = make(chan struct{})
	c.lead = make(chan struct{}, 1)
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
	for {
		select {
		case <-c.done:
			// A slot handed to us before another flush took our call
			// must be used, or it is lost.
			select {
			case <-c.lead:
				b.flush(ctx)
			default:
			}
			return
		case <-c.lead:
			b.flush(ctx)
		}
	}
}

// flush sends one batch from the head of the queue, then hands the slot on.
func (b *batcher) flush(ctx context.Context) {
	b.mu.Lock()
	n := min(len(b.queue), b.maxBatch)
	batch := make([]*call, n)
	copy(batch, b.queue)
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	b.mu.Unlock()

	if n > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
		b.exec(ctx, batch)
		cancel()
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	// Hand the slot to the first queued call that has none yet; if every
	// queued call already has one coming, the slot is not needed.
	for _, c := range b.queue {
		if !c.handed {
			c.handed = true
			c.lead <- struct{}{} // never blocks: a call is handed a slot at most once
			return
		}
	}
	b.inflight--
}

func (b *batcher) exec(ctx context.Context, batch []*call) {
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = b.rdb.EvalSha(ctx, c.s.sha, c.keys, c.args...).Result()
		if isNoScript(c.err) {
			c.res, c.err = b.rdb.Eval(ctx, c.s.src, c.keys, c.args...).Result()
		}
		close(c.done)
		return
	}
	cmds := make([]*redis.Cmd, len(batch))
	_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range batch {
			cmds[i] = p.EvalSha(ctx, c.s.sha, c.keys, c.args...)
		}
		return nil
	})
	var again []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again = append(again, i) // script cache flushed or a new node: send the source
		}
	}
	if len(again) > 0 {
		_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				c := batch[i]
				cmds[i] = p.Eval(ctx, c.s.src, c.keys, c.args...)
			}
			return nil
		})
	}
	for i, c := range batch {
		c.res, c.err = cmds[i].Result()
		close(c.done)
	}
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
