// Package ttlcheck holds the checks the Redis backends' tests share that
// every TTL goes to Redis as a duration (PX, PEXPIRE), never as an
// absolute time a clock step would move (PITFALLS 3).
package ttlcheck

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/internal/redisscript"
)

// absoluteExpiry matches the Redis forms that take an expiry as a Unix
// time, computed from some clock, rather than as a duration.
var absoluteExpiry = regexp.MustCompile(`(?i)\b(PXAT|EXAT|PEXPIREAT|EXPIREAT)\b`)

// MS is d in whole milliseconds, as the backends send TTLs.
func MS(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// Scripts checks that no lock script sets an absolute expiry and that
// the acquire and refresh scripts use their TTL argument as a PX or
// PEXPIRE duration, and returns the scripts by SHA-1 and by source (EVAL
// after NOSCRIPT) for CheckSent.
func Scripts(t testing.TB) map[string]string {
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

// CheckSent checks the commands sent for a try with TTL try, a refresh to
// refresh, and a blocking acquire with TTL wait, each released.
func CheckSent(t testing.TB, scripts map[string]string, cmds [][]string, try, refresh, wait string) {
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

// Run takes l's locks the ways that send a TTL (a try, a refresh, a
// blocking acquire, each released) and checks with CheckSent what sent
// returns afterwards: the commands l's client sent.
func Run(t testing.TB, l *lock.Locker, sent func() [][]string) {
	t.Helper()
	scripts := Scripts(t) // first: the flow below stops at its first failure
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
	CheckSent(t, scripts, sent(), MS(tryTTL), MS(refreshTTL), MS(waitTTL))
}
