package redisscript

import "testing"

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
			got, n := AppendName([]byte("x"), DefaultPrefix, tc.key, suffix)
			if string(got) != "x"+want || string(got[1:1+n]) != tc.lock {
				t.Errorf("AppendName(%q, %q) = %q, %d; want %q, %d", tc.key, suffix, got, n, "x"+want, len(tc.lock))
			}
		}
	}
}
