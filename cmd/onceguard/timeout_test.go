package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// A request deadline that, with a quarter more for the settlement, would
// outlast the key's lease stops serve before it starts (PITFALLS 17); one
// left at 0 is 3/5 of the lease, whatever the lease.
func TestRequestTimeoutInsideKeyLease(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--key-lease", "1s", "--request-timeout", "800ms"}, false}, // 800ms + 200ms = 1s
		{[]string{"--key-lease", "1s", "--request-timeout", "-1s"}, false},
		{[]string{"--key-lease", "0s"}, false},
		{[]string{"--request-timeout", "30s"}, false}, // the default lease is 30s
		{[]string{"--key-lease", "1s", "--request-timeout", "700ms"}, true},
		{[]string{"--key-lease", "3s"}, true}, // 1.8s
		{nil, true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out syncBuffer
		args := append([]string{"serve", "--data-dir", t.TempDir(), "--addr", "127.0.0.1:0"}, tc.args...)
		done := make(chan error, 1)
		go func() { done <- run(ctx, args, func(string) string { return "" }, &out, io.Discard) }()
		var err error
		if tc.ok {
			// Started: wait for its line, then stop it.
			for !strings.Contains(out.String(), "listening") && ctx.Err() == nil {
				select {
				case err = <-done:
					t.Fatalf("%v: serve ended at start: %v", tc.args, err)
				case <-time.After(20 * time.Millisecond):
				}
			}
			cancel()
			err = <-done
			if ctx.Err() == nil || !strings.Contains(out.String(), "listening") {
				t.Errorf("%v: serve did not start (%v)", tc.args, err)
			}
		} else {
			err = <-done
			cancel()
			if err == nil || !strings.Contains(err.Error(), "lease") || strings.Contains(out.String(), "listening") {
				t.Errorf("%v: run = %v (printed %q); want an error about the lease, before anything starts", tc.args, err, out.String())
			}
		}
	}
}
