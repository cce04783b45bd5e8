package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/psp"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr bool
	}{
		{"version", []string{"version"}, "onceguard " + version, false},
		{"unknown command", []string{"nope"}, "", true},
		{"bad flag", []string{"serve", "--nope"}, "", true},
		{"bad max amount", []string{"serve", "--max-amount", "1e9"}, "", true},
		{"bad db url", []string{"serve", "--db", "oracle://x"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errOut)
			if (err != nil) != tc.wantErr {
				t.Fatalf("run(%q) = %v; want error %v", tc.args, err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("run(%q) printed %q; want it to contain %q", tc.args, out.String(), tc.want)
			}
		})
	}
}

// `onceguard psp` serves the simulator until its context ends.
func TestRunPSP(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"psp", "--addr", "127.0.0.1:0"}, func(string) string { return "" }, out, io.Discard)
	}()
	var url string
	for deadline := time.Now().Add(10 * time.Second); url == ""; {
		if i := strings.Index(out.String(), "http://"); i >= 0 {
			url = strings.TrimSpace(out.String()[i:])
		} else if time.Now().After(deadline) {
			t.Fatal("psp did not say where it listens")
		}
		time.Sleep(10 * time.Millisecond)
	}
	op, err := psp.NewClient(url, nil).Do(context.Background(), psp.Charge, "k", 100)
	if err != nil || op.Status != psp.Succeeded {
		t.Errorf("charge through the served psp = %+v, %v", op, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run(psp) after cancel = %v; want nil", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
