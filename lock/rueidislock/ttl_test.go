package rueidislock_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/internal/ttlcheck"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// recording is a rueidis client that keeps every command sent through Do
// and DoMulti (scripts included: rueidis.Lua.Exec sends through Do),
// copied before the client recycles it.
type recording struct {
	rueidis.Client
	mu   sync.Mutex
	cmds [][]string
}

func (r *recording) record(cmds ...rueidis.Completed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cmds {
		r.cmds = append(r.cmds, slices.Clone(c.Commands()))
	}
}

func (r *recording) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r.record(cmd)
	return r.Client.Do(ctx, cmd)
}

func (r *recording) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	r.record(multi...)
	return r.Client.DoMulti(ctx, multi...)
}

func (r *recording) sent() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.cmds...)
}

// Redis TTLs must be relative (pitfall 3), as in redislock: every TTL is
// sent as a duration in milliseconds, PX or PEXPIRE (in a command or as a
// script argument used that way), never PXAT/PEXPIREAT/EXAT/EXPIREAT with
// a deadline from the client's wall clock. Checked on the commands as sent,
// for a try (SET NX PX), a blocking acquire (script), refresh and release.
func TestTTLsSentRelative(t *testing.T) {
	rec := &recording{Client: shared(t)}
	l := lock.New(rueidislock.New(rec, nil), nil)
	ttlcheck.Run(t, l, rec.sent)
}
