package redistest_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/redistest"
)

func mustDo(t *testing.T, s *redistest.Server, args ...string) any {
	t.Helper()
	reply, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return reply
}

func assertRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("dial %s succeeded, want connection refused", addr)
	}
}

func TestServerDo(t *testing.T) {
	t.Parallel()
	s := redistest.StartServer(t)

	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Fatalf("PING = %#v, want PONG", got)
	}
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || s.Addr() == "127.0.0.1:6379" {
		t.Fatalf("Addr = %q, want a private loopback port", s.Addr())
	}
	if want := "redis://" + s.Addr() + "/0"; s.URL() != want {
		t.Fatalf("URL = %q, want %q", s.URL(), want)
	}
	if got := mustDo(t, s, "SET", "k", "v w\r\nx"); got != "OK" {
		t.Fatalf("SET = %#v, want OK", got)
	}
	if got := mustDo(t, s, "GET", "k"); got != "v w\r\nx" {
		t.Fatalf("GET = %#v", got)
	}
	if got := mustDo(t, s, "GET", "missing"); got != nil {
		t.Fatalf("GET missing = %#v, want nil", got)
	}
	if got := mustDo(t, s, "INCR", "n"); got != int64(1) {
		t.Fatalf("INCR = %#v, want int64(1)", got)
	}
	if got := mustDo(t, s, "RPUSH", "l", "a", "b"); got != int64(2) {
		t.Fatalf("RPUSH = %#v, want int64(2)", got)
	}
	got, ok := mustDo(t, s, "LRANGE", "l", "0", "-1").([]any)
	if !ok || len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("LRANGE = %#v, want [a b]", got)
	}
	// The defaults were applied: no persistence.
	cfg, _ := mustDo(t, s, "CONFIG", "GET", "save").([]any)
	if len(cfg) != 2 || cfg[1] != "" {
		t.Fatalf("CONFIG GET save = %#v, want empty", cfg)
	}

	_, err := s.Do("INCR", "k")
	var rerr redistest.ReplyError
	if !errors.As(err, &rerr) || rerr.Prefix() != "ERR" {
		t.Fatalf("INCR on a string: err = %#v, want an ERR ReplyError", err)
	}
}

func TestServerExtraArgs(t *testing.T) {
	t.Parallel()
	s := redistest.StartServer(t, "--maxmemory", "12345678")
	cfg, _ := mustDo(t, s, "CONFIG", "GET", "maxmemory").([]any)
	if len(cfg) != 2 || cfg[1] != "12345678" {
		t.Fatalf("CONFIG GET maxmemory = %#v", cfg)
	}
}

func TestKillAndRestart(t *testing.T) {
	t.Parallel()
	s := redistest.StartServer(t)
	addr := s.Addr()
	mustDo(t, s, "SET", "k", "v")

	s.Kill(t)
	assertRefused(t, addr)
	if _, err := s.DoTimeout(time.Second, "PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Kill(t) // killing a dead server is a no-op

	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("Addr after Restart = %q, want %q", s.Addr(), addr)
	}
	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Fatalf("PING after Restart = %#v", got)
	}
	if got := mustDo(t, s, "GET", "k"); got != nil {
		t.Fatalf("GET after Restart = %#v, want nil (data lost)", got)
	}

	// Restart of a running server replaces the process.
	mustDo(t, s, "SET", "k", "v2")
	s.Restart(t)
	if got := mustDo(t, s, "GET", "k"); got != nil {
		t.Fatalf("GET after second Restart = %#v, want nil", got)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := redistest.StartServer(t)

	s.Pause(t)
	start := time.Now()
	_, err := s.DoTimeout(300*time.Millisecond, "PING")
	var nerr net.Error
	if !errors.As(err, &nerr) || !nerr.Timeout() {
		t.Fatalf("PING on a paused server: err = %v, want a timeout", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("DoTimeout took %v, deadline was not honoured", d)
	}

	s.Resume(t)
	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Fatalf("PING after Resume = %#v", got)
	}

	// A paused server is still cleaned up (SIGKILL works on stopped
	// processes); leave it paused on purpose.
	s.Pause(t)
}

func TestCleanupKillsServer(t *testing.T) {
	t.Parallel()
	var addr string
	t.Run("inner", func(t *testing.T) {
		s := redistest.StartServer(t)
		addr = s.Addr()
		s.Pause(t) // cleanup must cope with a stopped process too
	})
	assertRefused(t, addr)
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)

	addrs := c.Addrs()
	if len(addrs) != 3 || len(c.Nodes) != 3 {
		t.Fatalf("Addrs = %v, want 3 nodes", addrs)
	}
	for i, node := range c.Nodes {
		if addrs[i] != node.Addr() {
			t.Fatalf("Addrs[%d] = %q, want %q", i, addrs[i], node.Addr())
		}
		info, _ := mustDo(t, node, "CLUSTER", "INFO").(string)
		if v, _ := redistest.InfoField(info, "cluster_state"); v != "ok" {
			t.Fatalf("%s: cluster_state = %q, want ok", node.Addr(), v)
		}
	}

	// Every node either owns the key's slot or redirects: both prove a
	// working cluster. Across all nodes exactly one must answer OK.
	owners := 0
	for _, node := range c.Nodes {
		reply, err := node.Do("SET", "onceguard-key", "v")
		var rerr redistest.ReplyError
		switch {
		case err == nil && reply == "OK":
			owners++
		case errors.As(err, &rerr) && rerr.Prefix() == "MOVED":
		default:
			t.Fatalf("%s: SET = %#v, %v; want OK or MOVED", node.Addr(), reply, err)
		}
	}
	if owners != 1 {
		t.Fatalf("%d nodes accepted the SET, want exactly 1", owners)
	}
}
