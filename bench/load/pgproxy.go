package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/internal/testproc"
)

// The round-trip proxy sits between one PostgreSQL contender (pgbench,
// the floor, a service configuration) and the server, on loopback, and
// counts the frontend messages after which the client waits for the
// server: Sync ('S', the end of an extended-protocol exchange) and Query
// ('Q', a simple query). Each is answered by one ReadyForQuery, so their
// number is the number of client→server round trips. It runs as a child
// process of the load (-pg-proxy-serve HOST:PORT), one per contender, so
// that its CPU is neither the contender's nor the load generator's.

// Untyped first messages (after the length, an int32 code).
const (
	pgSSLRequest    = 80877103
	pgGSSENCRequest = 80877104
	pgMaxStartup    = 10000 // PostgreSQL refuses longer startup packets
)

// feCounter parses a frontend (client→server) byte stream fed in pieces
// of any size: first an untyped startup packet (int32 length including
// itself, then an int32 code; an SSLRequest or GSSENCRequest is followed
// by another untyped packet), then messages of one type byte and an int32
// big-endian length including itself.
type feCounter struct {
	started  bool // past the startup packet: messages are typed
	hdr      [8]byte
	hn       int
	skip     int64 // bytes of the current message still to pass
	messages int64
	syncs    int64
	queries  int64
	broken   bool // not the protocol (TLS after an accepted SSLRequest, garbage): counting stopped
}

func (c *feCounter) feed(p []byte) {
	for len(p) > 0 && !c.broken {
		if c.skip > 0 {
			n := int64(len(p))
			if n > c.skip {
				n = c.skip
			}
			c.skip -= n
			p = p[n:]
			continue
		}
		need := 5
		if !c.started {
			need = 8
		}
		n := copy(c.hdr[c.hn:need], p)
		c.hn += n
		p = p[n:]
		if c.hn < need {
			return
		}
		c.hn = 0
		c.messages++
		if !c.started {
			l := int64(binary.BigEndian.Uint32(c.hdr[:4]))
			if l < 8 || l > pgMaxStartup {
				c.broken = true
				return
			}
			c.skip = l - 8
			if code := binary.BigEndian.Uint32(c.hdr[4:8]); code != pgSSLRequest && code != pgGSSENCRequest {
				c.started = true
			}
			continue
		}
		l := int64(binary.BigEndian.Uint32(c.hdr[1:5]))
		if l < 4 {
			c.broken = true
			return
		}
		c.skip = l - 4
		switch c.hdr[0] {
		case 'S':
			c.syncs++
		case 'Q':
			c.queries++
		}
	}
}

func (c *feCounter) roundTrips() int64 { return c.syncs + c.queries }

// proxyCounts are a proxy's totals so far.
type proxyCounts struct {
	syncs, queries, conns, broken int64
	ok                            bool
}

func (c proxyCounts) roundTrips() int64 { return c.syncs + c.queries }

// serveProxy is the child: it proxies 127.0.0.1:0 to upstream, prints
// "listening on ADDR" and then, for every line read on stdin, one line
// "counts SYNCS QUERIES CONNS BROKEN". It exits when stdin ends.
func serveProxy(upstream string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var syncs, queries, conns, broken atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go proxyConn(c, upstream, &syncs, &queries, &broken)
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "listening on %s\n", ln.Addr())
	if err := out.Flush(); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Fprintf(out, "counts %d %d %d %d\n", syncs.Load(), queries.Load(), conns.Load(), broken.Load())
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func proxyConn(c net.Conn, upstream string, syncs, queries, broken *atomic.Int64) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		return
	}
	defer u.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(c, u) // server→client: not parsed (TCP to TCP: spliced)
		_ = c.Close()
	}()
	var fe feCounter
	var lastS, lastQ int64
	buf := make([]byte, 32*1024)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			wasBroken := fe.broken
			fe.feed(buf[:n])
			if fe.syncs != lastS {
				syncs.Add(fe.syncs - lastS)
				lastS = fe.syncs
			}
			if fe.queries != lastQ {
				queries.Add(fe.queries - lastQ)
				lastQ = fe.queries
			}
			if fe.broken && !wasBroken {
				broken.Add(1)
			}
			if _, werr := u.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = u.Close()
	<-done
}

// pgProxy is the parent's handle on one proxy child.
type pgProxy struct {
	name, addr string
	cmd        *exec.Cmd
	pid        int
	mu         sync.Mutex
	in         io.WriteCloser
	out        *bufio.Reader
	done       chan struct{}
	log        *os.File
}

// startProxy starts the load's own binary as a proxy to upstream.
func startProxy(name, upstream, logPath string) (*pgProxy, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-pg-proxy-serve", upstream)
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := testproc.Start(cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start proxy: %w", err)
	}
	p := &pgProxy{name: name, cmd: cmd, pid: cmd.Process.Pid, in: in, out: bufio.NewReader(outPipe), done: make(chan struct{}), log: logf}
	go func() { _ = cmd.Wait(); close(p.done) }()
	type res struct {
		line string
		err  error
	}
	first := make(chan res, 1)
	go func() { l, err := p.out.ReadString('\n'); first <- res{l, err} }()
	select {
	case r := <-first:
		addr, ok := strings.CutPrefix(strings.TrimSpace(r.line), "listening on ")
		if r.err != nil || !ok {
			p.stop()
			return nil, fmt.Errorf("proxy for %s: no address (%q, %v); log %s", name, r.line, r.err, logPath)
		}
		p.addr = addr
	case <-time.After(20 * time.Second):
		p.stop()
		return nil, fmt.Errorf("proxy for %s did not start within 20s; log %s", name, logPath)
	}
	return p, nil
}

// counts asks the proxy for its totals; ok false when it did not answer.
func (p *pgProxy) counts() proxyCounts {
	if p == nil {
		return proxyCounts{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := io.WriteString(p.in, "\n"); err != nil {
		return proxyCounts{}
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		return proxyCounts{}
	}
	return parseProxyCounts(line)
}

func parseProxyCounts(line string) proxyCounts {
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "counts" {
		return proxyCounts{}
	}
	var v [4]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return proxyCounts{}
		}
		v[i] = n
	}
	return proxyCounts{syncs: v[0], queries: v[1], conns: v[2], broken: v[3], ok: true}
}

// stop closes the proxy's stdin (it exits) and waits, 5 s at most.
func (p *pgProxy) stop() {
	if p == nil {
		return
	}
	_ = p.in.Close()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
}

// pgUpstream is host:port of a postgres:// DSN (port 5432 if none).
func pgUpstream(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	if u.Hostname() == "" {
		return "", errors.New("-pg: no host in the DSN (a Unix socket cannot be proxied; pass -pg-proxy=false)")
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// withHost returns dsn (a postgres:// URL) connecting to addr instead.
func withHost(dsn, addr string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Host = addr
	return u.String()
}
