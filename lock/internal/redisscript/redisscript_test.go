package redisscript

import (
	"testing"

	"github.com/onceguard/onceguard/lock"
)

// The names of a lock's keys and channel are part of the protocol between
// processes, whichever backend they use: they must not change.
func TestNames(t *testing.T) {
	hashed := "onceguard:lock:#{" + "0c81d082effbfc200f529870c4baa760fbb3ea0736a2551caa6b195a7015ed18" + "}"
	for _, tc := range []struct{ key, lock string }{
		{"order:42", "onceguard:lock:{order:42}"},
		{"a{b}c", hashed},
	} {
		for suffix, want := range map[string]string{
			"":              tc.lock,
			FenceSuffix:     tc.lock + ":fence",
			QueueSuffix:     tc.lock + ":q",
			DeadlinesSuffix: tc.lock + ":qx",
			WakeSuffix:      tc.lock + ":wake",
		} {
			if got := Name(DefaultPrefix, tc.key, suffix); got != want {
				t.Errorf("Name(%q, %q) = %q; want %q", tc.key, suffix, got, want)
			}
			if got, n := NameAndLock(DefaultPrefix, tc.key, suffix); got != want || got[:n] != tc.lock {
				t.Errorf("NameAndLock(%q, %q) = %q, %d; want %q, %d", tc.key, suffix, got, n, want, len(tc.lock))
			}
			got, n := AppendName([]byte("x"), DefaultPrefix, tc.key, suffix)
			if string(got) != "x"+want || string(got[1:1+n]) != tc.lock {
				t.Errorf("AppendName(%q, %q) = %q, %d; want %q, %d", tc.key, suffix, got, n, "x"+want, len(tc.lock))
			}
		}
	}
}

func TestOutcomeAndNotNow(t *testing.T) {
	for n, want := range map[int64]error{1: nil, 0: lock.ErrExpired, -1: lock.ErrNotHeld} {
		if err, ok := Outcome(n); !ok || err != want {
			t.Errorf("Outcome(%d) = %v, %v; want %v, true", n, err, ok, want)
		}
	}
	if _, ok := Outcome(2); ok {
		t.Error("Outcome(2) is known; want unknown")
	}
	for reply, want := range map[string]bool{
		"LOADING Redis is loading": true, "BUSY Redis is busy running a script": true, "READONLY You can't write": true,
		"NOSCRIPT No matching script": false, "ERR wrong number of arguments": false, "": false,
	} {
		if got := NotNow(reply); got != want {
			t.Errorf("NotNow(%q) = %v; want %v", reply, got, want)
		}
	}
}
