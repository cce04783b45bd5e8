package redislock

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The names of a lock's keys and channel are part of the protocol between
// processes (and documented in the package doc): they must not change.
func TestNames(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{}) // never dialed: names only
	defer rdb.Close()
	b := New(rdb, nil)
	hashed := "onceguard:lock:#{" + "0c81d082effbfc200f529870c4baa760fbb3ea0736a2551caa6b195a7015ed18" + "}"
	for _, tc := range []struct{ key, lock string }{
		{"order:42", "onceguard:lock:{order:42}"},
		{"a{b}c", hashed},
	} {
		for suffix, want := range map[string]string{
			"":              tc.lock,
			fenceSuffix:     tc.lock + ":fence",
			deadlinesSuffix: tc.lock + ":qx",
			wakeSuffix:      tc.lock + ":wake",
		} {
			if got := b.name(tc.key, suffix); got != want {
				t.Errorf("name(%q, %q) = %q; want %q", tc.key, suffix, got, want)
			}
			got, n := b.appendName([]byte("x"), tc.key, suffix)
			if string(got) != "x"+want || string(got[1:1+n]) != tc.lock {
				t.Errorf("appendName(%q, %q) = %q, %d; want %q, %d", tc.key, suffix, got, n, "x"+want, len(tc.lock))
			}
		}

		// Release's keys, as a call sends them.
		c := b.batch.get()
		b.queueScript(context.Background(), c, scriptRelease, tc.key, "owner")
		want := []string{"evalsha", scriptRelease.sha, "3", tc.lock, tc.lock + ":q", tc.lock + ":qx", "owner"}
		args := c.cmds[0].Args()
		if len(args) != len(want) {
			t.Fatalf("release args = %v; want %q", args, want)
		}
		for i, a := range args {
			if s := toString(a); s != want[i] {
				t.Errorf("release arg %d = %q; want %q", i, s, want[i])
			}
		}
		b.batch.put(c)
	}
}

func toString(a any) string {
	switch a := a.(type) {
	case string:
		return a
	case *arg:
		return a.String()
	}
	return "?"
}
