package redislock_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock/internal/redisscript"
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

// absoluteExpiry matches the Redis forms that take an expiry as a Unix
// time, computed from some clock, rather than as a duration.
var absoluteExpiry = regexp.MustCompile(`(?i)\b(PXAT|EXAT|PEXPIREAT|EXPIREAT)\b`)

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
	l := redislock.New(rdb, nil)
	scripts := scriptIDs(t) // first: the flow below stops at its first failure
	ctx := context.Background()
	key := fmt.Sprintf("ttl-relative/%d", time.Now().UnixNano())

	// Distinct odd TTLs, so each is found where it belongs.
	const tryTTL, refreshTTL, waitTTL = 7777 * time.Millisecond, 8888 * time.Millisecond, 6666 * time.Millisecond
	lease, err := l.TryAcquire(ctx, key, tryTTL)
	if err != nil {
		t.Fatalf("TryAcquire = %v", err)
	}
	if err := lease.Refresh(ctx, refreshTTL); err != nil {
		t.Fatalf("Refresh = %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	lease, err = l.Acquire(ctx, key, waitTTL) // blocking: the acquire script
	if err != nil {
		t.Fatalf("Acquire = %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}

	checkSent(t, scripts, rec.sent(), ms(tryTTL), ms(refreshTTL), ms(waitTTL))
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// scriptIDs checks that no lock script sets an absolute expiry and that
// the acquire and refresh scripts use their TTL argument as a PX or
// PEXPIRE duration, and returns the scripts by SHA-1 and by source (EVAL
// after NOSCRIPT) for checkSent.
func scriptIDs(t *testing.T) map[string]string {
	t.Helper()
	scripts := map[string]string{}
	for name, src := range map[string]string{
		"acquire": redisscript.Acquire, "release": redisscript.Release, "refresh": redisscript.Refresh,
		"leave": redisscript.Leave, "raise": redisscript.Raise, "reseed": redisscript.Reseed,
	} {
		sum := sha1.Sum([]byte(src))
		scripts[hex.EncodeToString(sum[:])], scripts[src] = name, name
		if m := absoluteExpiry.FindString(src); m != "" {
			t.Errorf("script %s uses %s; want relative PX/PEXPIRE only", name, m)
		}
	}
	for _, u := range []struct{ name, src, use string }{
		{"acquire", redisscript.Acquire, "'PX', ARGV[2]"},
		{"refresh", redisscript.Refresh, "'PEXPIRE', KEYS[1], ARGV[2]"},
	} {
		if !strings.Contains(u.src, u.use) {
			t.Errorf("script %s does not contain %s; want its TTL argument (ARGV[2]) used as a relative duration", u.name, u.use)
		}
	}
	return scripts
}

// checkSent checks the commands sent for a try with TTL try, a refresh to
// refresh, and a blocking acquire with TTL wait, each released.
func checkSent(t *testing.T, scripts map[string]string, cmds [][]string, try, refresh, wait string) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cmds {
		name := strings.ToLower(c[0])
		for _, a := range c {
			switch strings.ToLower(a) {
			case "pxat", "exat", "pexpireat", "expireat":
				t.Errorf("sent %q; want relative TTLs only (PX, PEXPIRE)", c)
			}
			// A Unix time in s, ms or µs: no TTL in this test is that long.
			if n, err := strconv.ParseInt(a, 10, 64); err == nil && n >= 1e9 {
				t.Errorf("sent %q with %d, a timestamp; want TTLs as durations in ms", c, n)
			}
		}
		switch name {
		case "set":
			// The try: SET lock owner NX PX ttl.
			if len(c) == 6 && strings.EqualFold(c[3], "nx") {
				if !strings.EqualFold(c[4], "px") || c[5] != try {
					t.Errorf("try sent %q; want SET ... NX PX %s", c, try)
				}
				seen["set px"] = true
			}
		case "evalsha", "eval":
			if len(c) < 3 {
				t.Errorf("sent %q; want a script run", c)
				continue
			}
			script, ok := scripts[c[1]]
			if !ok {
				t.Errorf("sent %q; want one of the redisscript scripts", c)
				continue
			}
			nkeys, _ := strconv.Atoi(c[2])
			argv := c[min(3+nkeys, len(c)):]
			switch script {
			case "acquire": // owner, ttl, fence retention, wait
				if len(argv) != 4 || argv[1] != wait {
					t.Errorf("acquire script sent with ARGV %q; want ARGV[2] = the TTL in ms, %s", argv, wait)
				}
			case "refresh": // owner, ttl
				if len(argv) != 2 || argv[1] != refresh {
					t.Errorf("refresh script sent with ARGV %q; want ARGV[2] = the TTL in ms, %s", argv, refresh)
				}
			}
			seen[script] = true
		case "pexpireat", "expireat":
			t.Errorf("sent %q; want PEXPIRE with a duration", c)
		}
	}
	for _, want := range []string{"set px", "acquire", "refresh", "release"} {
		if !seen[want] {
			t.Errorf("no %s sent (saw %q); the test did not see what it checks", want, cmds)
		}
	}
}
