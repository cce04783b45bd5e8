package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/testproc"
)

// redisNode is one private redis-server process started by the bench for
// the redlock rows: its own free loopback port, no persistence, killed when
// the run ends (and by the kernel if the bench dies first, on Linux).
type redisNode struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been reaped
}

// startRedisNodes starts n independent redis-server processes on free
// loopback ports (never the shared server's). On error it stops the ones
// it started.
func startRedisNodes(ctx context.Context, bin string, n int, dir string) ([]*redisNode, error) {
	var nodes []*redisNode
	for i := range n {
		var node *redisNode
		var err error
		for range 5 { // a free port can be taken between the probe and the bind
			if node, err = startRedisNode(ctx, bin, dir, i); err == nil {
				break
			}
		}
		if err != nil {
			stopRedisNodes(nodes)
			return nil, err
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

func startRedisNode(ctx context.Context, bin, dir string, i int) (*redisNode, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	ndir := fmt.Sprintf("%s/node%d-%d", dir, i, port)
	if err := os.MkdirAll(ndir, 0o700); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", ndir, "--logfile", ndir+"/redis.log")
	if err := testproc.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	node := &redisNode{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(node.done)
	}()
	// Wait for PING.
	c := redis.NewClient(&redis.Options{Addr: node.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return node, nil
		}
		select {
		case <-node.done:
			log, _ := os.ReadFile(ndir + "/redis.log")
			return nil, fmt.Errorf("redis-server on port %d exited: %s", port, tail(string(log), 500))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stopRedisNodes([]*redisNode{node})
			return nil, fmt.Errorf("redis-server on port %d: no PING answer: %w", port, errors.Join(err, ctx.Err()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopRedisNodes kills the processes and waits for them to be reaped.
func stopRedisNodes(nodes []*redisNode) {
	for _, n := range nodes {
		_ = n.cmd.Process.Kill()
	}
	for _, n := range nodes {
		select {
		case <-n.done:
		case <-time.After(5 * time.Second):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
