// Package redistest runs private redis-server processes for integration
// tests.
//
// Every server started here listens on its own free loopback port (never the
// shared Redis on 6379), keeps its files in a test temporary directory, and is
// killed and reaped by a t.Cleanup, also when the test fails with t.Fatal.
// Servers can be killed, restarted on the same port, paused (SIGSTOP, which
// turns them into a black hole) and resumed, and several of them can be joined
// into a local Redis Cluster.
//
// The package uses only the standard library: commands are sent to the
// servers as RESP over plain TCP (see [Server.Do]). It needs the redis-server
// and redis-cli binaries on PATH; see [RequireBinaries].
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// startTimeout bounds how long a start or restart waits for PING.
	startTimeout = 10 * time.Second
	// killTimeout bounds how long Kill waits for the process to exit.
	killTimeout = 10 * time.Second
	// doTimeout is the deadline of Do.
	doTimeout = 5 * time.Second
	// clusterTimeout bounds how long StartCluster waits for cluster_state:ok.
	clusterTimeout = 20 * time.Second
	// startAttempts is how many free ports StartServer tries on port clashes.
	startAttempts = 5
	// maxLogTail caps how much of a server log goes into a failure message.
	maxLogTail = 16 << 10
	// clusterBusOffset is the distance between a node's port and its
	// cluster bus port (Redis' default).
	clusterBusOffset = 10000
)

// RequireBinaries skips the test (t.Skip with a clear message) when
// redis-server or redis-cli is not on PATH, except when the environment
// variable CI is non-empty, where it fails the test (t.Fatal) instead.
func RequireBinaries(t testing.TB) {
	t.Helper()
	var missing []string
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("redistest: %s not found on PATH; install Redis (e.g. apt-get install redis-server) to run this integration test",
		strings.Join(missing, " and "))
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (failing instead of skipping because CI is set)")
	}
	t.Skip(msg)
}

// Server is one redis-server process owned by a test. It listens on
// 127.0.0.1 on a port that stays the same across [Server.Restart]. Its
// methods are safe for concurrent use.
type Server struct {
	port    int
	dir     string
	logPath string
	args    []string // full redis-server argument list, port included

	mu sync.Mutex
	p  *proc // the running process, nil after Kill
}

// proc is one redis-server process.
type proc struct {
	cmd       *exec.Cmd
	logOffset int64         // size of the log file when the process started
	done      chan struct{} // closed once the process has exited and been reaped
	err       error         // result of cmd.Wait, valid after done is closed
}

// StartServer starts redis-server on 127.0.0.1 on a free port with
// --save "" --appendonly no --dir t.TempDir() followed by extraArgs (which
// may therefore override those defaults), and waits (at most 10 s) until
// the server answers PING. It registers a t.Cleanup that kills the server
// and waits for it to exit. If the port is taken by someone else in the
// meantime, it retries on another free port. It fails the test, with the
// server's log output, when the server cannot be started.
//
// StartServer calls [RequireBinaries] first, so the test is skipped when
// Redis is not installed (outside CI).
func StartServer(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	RequireBinaries(t)
	return startServer(t, t.TempDir(), extraArgs)
}

// startServer implements StartServer with a caller-chosen directory, so that
// the caller can refer to that directory in extraArgs.
func startServer(t testing.TB, dir string, extraArgs []string) *Server {
	t.Helper()
	logPath := filepath.Join(dir, "redis-server.log")
	clusterEnabled := hasClusterEnabled(extraArgs)
	var failures []string
	for attempt := 1; attempt <= startAttempts; attempt++ {
		port, err := freePort(clusterEnabled)
		if err != nil {
			t.Fatalf("redistest: no free port: %v", err)
		}
		s := &Server{
			port:    port,
			dir:     dir,
			logPath: logPath,
			args:    serverArgs(port, dir, extraArgs),
		}
		clash, err := s.start(t)
		if err == nil {
			return s
		}
		failures = append(failures, fmt.Sprintf("attempt %d (port %d): %v", attempt, port, err))
		if !clash {
			break
		}
	}
	t.Fatalf("redistest: starting redis-server failed:\n%s", strings.Join(failures, "\n"))
	return nil
}

func serverArgs(port int, dir string, extraArgs []string) []string {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
	}
	return append(args, extraArgs...)
}

// hasClusterEnabled reports whether args turn on cluster mode, in which case
// the cluster bus port (port+10000) has to be free as well.
func hasClusterEnabled(args []string) bool {
	for i, a := range args {
		if strings.EqualFold(a, "--cluster-enabled") && i+1 < len(args) && strings.EqualFold(args[i+1], "yes") {
			return true
		}
	}
	return false
}

// freePort returns a loopback port that is free right now. With busPort it
// also makes sure that port+10000 (the cluster bus) is valid and free.
func freePort(busPort bool) (int, error) {
	var lastErr error
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !busPort {
			l.Close()
			return port, nil
		}
		if port+clusterBusOffset > 65535 {
			l.Close()
			lastErr = fmt.Errorf("port %d has no valid cluster bus port", port)
			continue
		}
		bl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+clusterBusOffset)))
		l.Close()
		if err != nil {
			lastErr = err
			continue
		}
		bl.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no port with a free cluster bus port found: %w", lastErr)
}

// start launches a new process for s and waits until it answers PING. The
// process is registered for cleanup before waiting, so it never outlives the
// test. clash reports that the failure looks like somebody else owning the
// port, so a retry (on another port, or later) may help.
func (s *Server) start(t testing.TB) (clash bool, err error) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return false, err
	}
	logFile, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return false, err
	}
	defer logFile.Close() // the child has its own copy of the descriptor
	var offset int64
	if fi, err := logFile.Stat(); err == nil {
		offset = fi.Size()
	}
	fmt.Fprintf(logFile, "### redistest: %s %s\n", bin, quoteArgs(s.args))

	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := startCmd(cmd); err != nil {
		return false, fmt.Errorf("exec %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, logOffset: offset, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	// Registered right away, so even a t.Fatal below (or in the caller)
	// cannot leak the process. Killing an already reaped process is a no-op.
	t.Cleanup(func() {
		if err := p.kill(); err != nil {
			t.Errorf("redistest: cleanup of redis-server on port %d: %v", s.port, err)
		}
	})

	if clash, err := s.waitReady(p); err != nil {
		p.kill()
		return clash, fmt.Errorf("%w\n--- redis-server log (%s) ---\n%s", err, s.logPath, s.logTail(p.logOffset))
	}
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
	return false, nil
}

// waitReady polls the new process p until it answers PING and is really the
// process listening on s's port.
func (s *Server) waitReady(p *proc) (clash bool, err error) {
	deadline := time.Now().Add(startTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			clash = strings.Contains(s.logTail(p.logOffset), "Address already in use")
			return clash, fmt.Errorf("redis-server exited before answering PING: %v", p.err)
		default:
		}
		reply, err := s.DoTimeout(time.Second, "PING")
		if err == nil && reply == "PONG" {
			// Make sure the server answering is ours and not someone
			// else's that grabbed the port first.
			pid, err := s.pid()
			if err != nil {
				lastErr = err
			} else if pid != p.cmd.Process.Pid {
				return true, fmt.Errorf("port %d is served by another process (pid %d, ours is %d)", s.port, pid, p.cmd.Process.Pid)
			} else {
				return false, nil
			}
		} else if err != nil {
			lastErr = err
		} else {
			lastErr = fmt.Errorf("unexpected PING reply %#v", reply)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false, fmt.Errorf("redis-server did not answer PING within %v: %v", startTimeout, lastErr)
}

// pid asks the server for its process id.
func (s *Server) pid() (int, error) {
	reply, err := s.DoTimeout(time.Second, "INFO", "server")
	if err != nil {
		return 0, err
	}
	info, ok := reply.(string)
	if !ok {
		return 0, fmt.Errorf("unexpected INFO reply %#v", reply)
	}
	v, ok := InfoField(info, "process_id")
	if !ok {
		return 0, errors.New("INFO server has no process_id")
	}
	return strconv.Atoi(v)
}

// kill sends SIGKILL to p and waits until it has exited and been reaped.
func (p *proc) kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill pid %d: %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("pid %d did not exit within %v of SIGKILL", p.cmd.Process.Pid, killTimeout)
	}
}

// logTail returns the server log written since offset, capped in size.
func (s *Server) logTail(offset int64) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > maxLogTail {
		offset = fi.Size() - maxLogTail
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxLogTail))
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return string(b)
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server's address as a Redis URL for database 0,
// "redis://127.0.0.1:PORT/0".
func (s *Server) URL() string {
	return "redis://" + s.Addr() + "/0"
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory (its --dir), which also holds
// its log file.
func (s *Server) Dir() string { return s.dir }

// LogPath returns the file that receives the server's stdout and stderr.
func (s *Server) LogPath() string { return s.logPath }

// Kill sends SIGKILL to the server and waits until the process has exited,
// so the port stops answering. Killing a server that is not running is a
// no-op. It fails the test if the process does not go away.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	p := s.p
	s.p = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	if err := p.kill(); err != nil {
		t.Fatalf("redistest: killing redis-server on port %d: %v", s.port, err)
	}
}

// Restart starts a new redis-server process on the same port with the same
// arguments and waits (at most 10 s) until it answers PING. A running (or
// paused) process is killed first. Data is lost since persistence is off;
// files in the server's directory, such as a cluster config file, are kept.
// It fails the test, with the server's log output, when the server cannot
// be started.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill(t)
	var failures []string
	for attempt := 1; attempt <= startAttempts; attempt++ {
		clash, err := s.start(t)
		if err == nil {
			return
		}
		failures = append(failures, fmt.Sprintf("attempt %d: %v", attempt, err))
		if !clash {
			break
		}
		// The port (or cluster bus port) may be briefly in use by
		// somebody else, e.g. as the source port of an outgoing connection.
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("redistest: restarting redis-server on port %d failed:\n%s", s.port, strings.Join(failures, "\n"))
}

// Pause stops the server with SIGSTOP. Connections are still accepted by
// the kernel but never answered: the server becomes a black hole until
// [Server.Resume]. Cleanup and Kill work on a paused server.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	s.signal(t, "pause", stopSignal)
}

// Resume continues a server stopped by [Server.Pause] with SIGCONT.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.signal(t, "resume", contSignal)
}

func (s *Server) signal(t testing.TB, what string, sig os.Signal) {
	t.Helper()
	if sig == nil {
		t.Skipf("redistest: cannot %s redis-server: job control signals are not supported on this platform", what)
	}
	s.mu.Lock()
	p := s.p
	s.mu.Unlock()
	if p == nil {
		t.Fatalf("redistest: cannot %s redis-server on port %d: it is not running", what, s.port)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("redistest: cannot %s redis-server on port %d: %v", what, s.port, err)
	}
}

// Do sends one command, as a RESP array of bulk strings, on a fresh
// connection and returns the reply decoded as: string for simple and bulk
// strings, int64 for integers, []any for arrays, nil for null bulk strings
// and null arrays. An error reply is returned as the error, of type
// [ReplyError] (inside arrays it appears as a ReplyError element). Dial,
// write and read are bounded by a 5 s deadline.
func (s *Server) Do(args ...string) (any, error) {
	return s.DoTimeout(doTimeout, args...)
}

// DoTimeout is like [Server.Do] with deadline d instead of 5 s. On a paused
// server it fails with a timeout error (net.Error with Timeout() true).
func (s *Server) DoTimeout(d time.Duration, args ...string) (any, error) {
	return DoAddr(s.Addr(), d, args...)
}

// DoAddr sends one command to the Redis server at addr, like [Server.Do],
// with deadline d for the whole exchange.
func DoAddr(addr string, d time.Duration, args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("redistest: empty command")
	}
	conn, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&buf, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return nil, err
	}
	reply, err := readReply(bufio.NewReader(conn))
	if err != nil {
		return nil, err
	}
	if rerr, ok := reply.(ReplyError); ok {
		return nil, rerr
	}
	return reply, nil
}

// ReplyError is an error reply from Redis, such as
// "MOVED 3999 127.0.0.1:7001" or "ERR unknown command".
type ReplyError string

// Error returns the error reply text without the leading '-'.
func (e ReplyError) Error() string { return string(e) }

// Prefix returns the first word of the error reply, such as "MOVED", "ERR"
// or "WRONGTYPE".
func (e ReplyError) Prefix() string {
	prefix, _, _ := strings.Cut(string(e), " ")
	return prefix
}

// readReply decodes one RESP2 reply (plus the RESP3 null, boolean and double
// types, should a server send them).
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redistest: malformed RESP line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return ReplyError(body), nil
	case ':':
		n, err := strconv.ParseInt(body, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("redistest: bad RESP integer %q", body)
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redistest: bad RESP bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		if b[n] != '\r' || b[n+1] != '\n' {
			return nil, errors.New("redistest: bulk string not terminated by CRLF")
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redistest: bad RESP array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			if arr[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return arr, nil
	case '_':
		return nil, nil
	case '#':
		return body == "t", nil
	case ',':
		return body, nil
	default:
		return nil, fmt.Errorf("redistest: unsupported RESP type %q", kind)
	}
}

// InfoField returns the value of field in the text of an INFO or
// CLUSTER INFO reply ("field:value" lines).
func InfoField(info, field string) (string, bool) {
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if ok && k == field {
			return v, true
		}
	}
	return "", false
}

// Cluster is a local Redis Cluster of masters without replicas, each node
// being a [Server] owned by the test.
type Cluster struct {
	// Nodes are the cluster's masters, in the order given to
	// redis-cli --cluster create (so Nodes[0] holds the lowest slots).
	Nodes []*Server
}

// StartCluster starts n (at least 3) masters with --cluster-enabled yes,
// --cluster-config-file in each node's temporary directory and
// --cluster-node-timeout 2000, joins them with
// redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes, and
// waits (at most 20 s) until every node reports cluster_state:ok in
// CLUSTER INFO, knows all n nodes, and all 16384 slots are assigned. It
// fails the test, with redis-cli's output, on error. All nodes are killed by
// t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	RequireBinaries(t)
	if n < 3 {
		t.Fatalf("redistest: StartCluster needs at least 3 masters, got %d", n)
	}
	c := &Cluster{Nodes: make([]*Server, n)}
	for i := range c.Nodes {
		dir := t.TempDir()
		c.Nodes[i] = startServer(t, dir, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		})
	}

	cliArgs := append([]string{"--cluster", "create"}, c.Addrs()...)
	cliArgs = append(cliArgs, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	cli := exec.CommandContext(ctx, "redis-cli", cliArgs...)
	cli.WaitDelay = time.Second
	out, err := cli.CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli %s failed: %v\n%s", quoteArgs(cliArgs), err, out)
	}

	deadline := time.Now().Add(clusterTimeout)
	for {
		problem := c.notReady(n)
		if problem == "" {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster not ready within %v: %s\n--- redis-cli %s ---\n%s",
				clusterTimeout, problem, quoteArgs(cliArgs), out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notReady returns why the cluster is not ready yet, or "" when it is.
func (c *Cluster) notReady(n int) string {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": "16384",
		"cluster_known_nodes":    strconv.Itoa(n),
	}
	for _, node := range c.Nodes {
		reply, err := node.DoTimeout(time.Second, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER INFO: %v", node.Addr(), err)
		}
		info, _ := reply.(string)
		for field, v := range want {
			if got, _ := InfoField(info, field); got != v {
				return fmt.Sprintf("%s: %s is %q, want %q; CLUSTER INFO:\n%s", node.Addr(), field, got, v, info)
			}
		}
	}
	return ""
}

// Addrs returns the addresses ("127.0.0.1:PORT") of all nodes, in the order
// of Nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}
