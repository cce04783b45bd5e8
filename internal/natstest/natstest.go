// Package natstest runs private nats-server processes with JetStream for
// integration tests, and finds the shared one (ONCEGUARD_TEST_NATS).
//
// Every server started here listens on its own free loopback port (never
// the shared NATS on 4222), keeps its JetStream store in a test temporary
// directory, and is killed and reaped by a t.Cleanup. A server can be
// stopped (SIGKILL) and restarted on the same port with the same store,
// as a NATS outage. It uses only the standard library and needs the
// nats-server binary (on PATH or /usr/sbin); see RequireBinary.
package natstest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/testproc"
)

const (
	startTimeout = 20 * time.Second
	killTimeout  = 10 * time.Second
)

// URL returns ONCEGUARD_TEST_NATS, or skips t when it is unset.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("ONCEGUARD_TEST_NATS")
	if u == "" {
		t.Skip("ONCEGUARD_TEST_NATS not set; skipping the integration test")
	}
	return u
}

// Binary returns the nats-server binary's path, "" when there is none.
func Binary() string { return testproc.LookPath("nats-server") }

// RequireBinary skips t when there is no nats-server binary, or fails it
// when the environment variable CI is set.
func RequireBinary(t testing.TB) string {
	t.Helper()
	bin := Binary()
	if bin != "" {
		return bin
	}
	msg := "natstest: nats-server not found; install it (apt-get install nats-server) to run this integration test"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (failing instead of skipping because CI is set)")
	}
	t.Skip(msg)
	return ""
}

// Server is one nats-server process with JetStream owned by a test. Its
// port and store stay the same across Restart. Its methods are safe for
// concurrent use.
type Server struct {
	bin, dir, logPath string
	port, monitor     int

	mu sync.Mutex
	p  *proc
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts a nats-server with JetStream on a free loopback port, its
// store under t.TempDir(), and waits until JetStream answers.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := RequireBinary(t)
	dir := t.TempDir()
	var lastErr error
	for range 5 { // a port taken between the probe and the bind: another one
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		monitor, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{bin: bin, dir: dir, logPath: filepath.Join(dir, "nats.log"), port: port, monitor: monitor}
		if lastErr = s.start(t); lastErr == nil {
			return s
		}
	}
	t.Fatalf("natstest: start nats-server: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start(t testing.TB) error {
	logFile, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-m", strconv.Itoa(s.monitor),
		"-js", "-sd", filepath.Join(s.dir, "store")}
	fmt.Fprintf(logFile, "### natstest: %s %s\n", s.bin, strings.Join(args, " "))
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := startCmd(cmd); err != nil {
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if err := p.kill(); err != nil {
			t.Errorf("natstest: cleanup of nats-server on port %d: %v", s.port, err)
		}
	})
	if err := s.waitReady(p); err != nil {
		_ = p.kill()
		return fmt.Errorf("%w\n--- nats-server log ---\n%s", err, s.logTail())
	}
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
	return nil
}

// waitReady polls the monitoring port's /healthz, which answers 200 once
// JetStream is up.
func (s *Server) waitReady(p *proc) error {
	deadline := time.Now().Add(startTimeout)
	c := &http.Client{Timeout: time.Second}
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("nats-server exited before it was ready: %v", p.err)
		default:
		}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.monitor))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("healthz: %s %s", resp.Status, body)
		} else {
			last = err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nats-server not ready within %v: %v", startTimeout, last)
}

func (p *proc) kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("pid %d did not exit within %v of SIGKILL", p.cmd.Process.Pid, killTimeout)
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return string(b)
}

// URL is the server's nats:// URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// Port is the server's client port.
func (s *Server) Port() int { return s.port }

// Kill stops the server with SIGKILL and waits until it is gone.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	p := s.p
	s.p = nil
	s.mu.Unlock()
	if p == nil {
		t.Fatal("natstest: Kill of a server that is not running")
	}
	if err := p.kill(); err != nil {
		t.Fatalf("natstest: kill: %v", err)
	}
}

// Restart starts a killed server again on its port with its store, and
// waits until JetStream answers.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	var err error
	for try := range 50 { // the port may linger a moment after the kill
		if err = s.start(t); err == nil {
			return
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(time.Duration(try+1) * 20 * time.Millisecond)
	}
	t.Fatalf("natstest: restart: %v", err)
}
