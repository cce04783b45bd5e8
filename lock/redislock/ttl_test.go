package redislock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/internal/ttlcheck"
	"github.com/onceguard/onceguard/lock/redislock"
)

// recorder is a go-redis hook that keeps every command the client sends,
// formatted while the hook runs (the backend reuses argument storage once a
// call returns: see the package documentation).
type recorder struct {
	mu   sync.Mutex
	cmds [][]string
}

func (r *recorder) record(cmd redis.Cmder) {
	args := make([]string, len(cmd.Args()))
	for i, a := range cmd.Args() {
		args[i] = fmt.Sprint(a)
	}
	r.mu.Lock()
	r.cmds = append(r.cmds, args)
	r.mu.Unlock()
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (r *recorder) sent() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.cmds...)
}

// Redis TTLs must be relative (pitfall 3): the backend sends every TTL as a
// duration in milliseconds, PX or PEXPIRE (in a command or in the scripts,
// as an argument they use that way), never PXAT/PEXPIREAT/EXAT/EXPIREAT
// with a deadline from the client's wall clock, which a clock step would
// move. Checked on the commands as sent, through a hook on the client,
// for a try (SET NX PX), a blocking acquire (script), refresh and release.
func TestTTLsSentRelative(t *testing.T) {
	rdb := redistest.Shared(t) // a client of its own: the hook sees only this test
	rec := &recorder{}
	rdb.AddHook(rec)
	l := lock.New(redislock.New(rdb, nil), nil)
	ttlcheck.Run(t, l, rec.sent)
}
