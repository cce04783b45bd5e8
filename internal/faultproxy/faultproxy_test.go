package faultproxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/leakcheck"

	"github.com/onceguard/onceguard/internal/faultproxy"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// echoServer echoes every connection line by line until it is closed; a
// client's half-close ends its connection. Its goroutines end with the
// test.
type echoServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, conns: map[net.Conn]bool{}}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns[c] = true
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer func() {
					e.mu.Lock()
					delete(e.conns, c)
					e.mu.Unlock()
					c.Close()
				}()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(e.close)
	return e
}

func (e *echoServer) addr() string { return e.ln.Addr().String() }

func (e *echoServer) close() {
	e.ln.Close()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

func startProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatalf("Start(%s) = %v", target, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends line and reads it back within d.
func roundTrip(c net.Conn, line string, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	buf := make([]byte, len(line)+1)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if got := string(buf); got != line+"\n" {
		return fmt.Errorf("echo = %q; want %q", got, line+"\n")
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPassThrough(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.addr())
	if p.Target() != e.addr() {
		t.Errorf("Target() = %s; want %s", p.Target(), e.addr())
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer c.Close()
			for j := range 50 {
				if err := roundTrip(c, fmt.Sprintf("conn %d line %d", i, j), 5*time.Second); err != nil {
					t.Errorf("round trip: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()

	// A large transfer arrives whole and in order.
	c := dial(t, p.Addr())
	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	payload[len(payload)-1] = '\n'
	go func() { _, _ = c.Write(payload) }()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := bufio.NewReaderSize(c, 1<<20).ReadBytes('\n')
	if err != nil || string(got) != string(payload) {
		t.Errorf("1 MiB echo: %d bytes, %v; want the payload back", len(got), err)
	}

	// A half-close reaches the server, whose close comes back as EOF.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("read after half-close = %d, %v; want EOF", n, err)
	}
	if s := p.Stats(); s.Accepted != 21 || s.Resets != 0 {
		t.Errorf("Stats() = %+v; want 21 accepted, no resets", s)
	}
}

func TestLatency(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.addr())
	c := dial(t, p.Addr())
	if err := roundTrip(c, "warm", time.Second); err != nil {
		t.Fatal(err)
	}
	const latency = 250 * time.Millisecond
	p.SetLatency(latency)
	start := time.Now()
	if err := roundTrip(c, "slow", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*latency {
		t.Errorf("round trip with %v latency took %v; want at least %v (both directions)", latency, d, 2*latency)
	}
	// A new connection is slow too, from its first byte.
	c2 := dial(t, p.Addr())
	start = time.Now()
	if err := roundTrip(c2, "new", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*latency {
		t.Errorf("first round trip of a new connection took %v; want at least %v", d, 2*latency)
	}
	// Latency delays; it does not serialise: 5 lines written at once come
	// back after one round trip, not five.
	start = time.Now()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	for i := range 5 {
		fmt.Fprintf(c, "burst %d\n", i)
		time.Sleep(5 * time.Millisecond) // separate chunks
	}
	r := bufio.NewReader(c)
	for range 5 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 4*latency {
		t.Errorf("5 pipelined lines took %v; want about one round trip (%v), not five", d, 2*latency)
	}
	_ = c.SetDeadline(time.Time{})
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := roundTrip(c2, "fast", time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= latency {
		t.Errorf("round trip after Heal took %v; want no latency", d)
	}
}

func TestBlackhole(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.addr())
	open := dial(t, p.Addr())
	if err := roundTrip(open, "before", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	// An open connection: the write goes out, no answer comes: a timeout.
	if err := roundTrip(open, "held", 200*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on an open connection in the black hole = %v; want a timeout", err)
	}
	// A new connection is accepted, not refused, and then silent.
	fresh, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial into the black hole = %v; want accepted (a black hole is not a refusal)", err)
	}
	defer fresh.Close()
	if err := roundTrip(fresh, "fresh", 200*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on a new connection in the black hole = %v; want a timeout", err)
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	// What was held is delivered after Heal, in order: the open
	// connection's line, then the new connection's.
	_ = open.SetReadDeadline(time.Now().Add(2 * time.Second))
	if line, err := bufio.NewReader(open).ReadString('\n'); err != nil || line != "held\n" {
		t.Errorf("after Heal, the held line = %q, %v; want %q", line, err, "held\n")
	}
	_ = fresh.SetReadDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(fresh)
	if line, err := r.ReadString('\n'); err != nil || line != "fresh\n" {
		t.Errorf("after Heal, the new connection's held line = %q, %v; want %q", line, err, "fresh\n")
	}
	if err := roundTrip(fresh, "after", time.Second); err != nil {
		t.Errorf("round trip after Heal: %v", err)
	}
}

// Stall black-holes the connections open at the time, for good (Heal
// does not revive them), while later ones are forwarded.
func TestStall(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.addr())
	old := dial(t, p.Addr())
	if err := roundTrip(old, "before", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if err := roundTrip(old, "held", 200*time.Millisecond); !isTimeout(err) {
		t.Errorf("round trip on a stalled connection = %v; want a timeout", err)
	}
	fresh := dial(t, p.Addr())
	if err := roundTrip(fresh, "fresh", time.Second); err != nil {
		t.Errorf("round trip on a connection made after Stall: %v", err)
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	_ = old.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := old.Read(make([]byte, 16)); !isTimeout(err) {
		t.Errorf("after Heal, a stalled connection read %d bytes, %v; want still nothing (a timeout)", n, err)
	}
}

func TestReset(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.addr())
	conns := []net.Conn{dial(t, p.Addr()), dial(t, p.Addr())}
	for _, c := range conns {
		if err := roundTrip(c, "before", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.Reset()
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read after Reset = %v; want ECONNRESET", err)
		}
	}
	// The server's side was reset too: the echo server has no connection left.
	waitFor(t, func() bool { e.mu.Lock(); defer e.mu.Unlock(); return len(e.conns) == 0 }, "the echo server's connections to end")
	// A one-shot reset: new connections work.
	if err := roundTrip(dial(t, p.Addr()), "after", time.Second); err != nil {
		t.Errorf("new connection after Reset: %v", err)
	}

	p.ResetUntilHeal()
	for range 3 {
		// Accepted, then reset (on loopback, possibly before connect returns).
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err == nil {
			err = roundTrip(c, "x", 2*time.Second)
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("connection while resetting = %v; want ECONNRESET", err)
		}
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(dial(t, p.Addr()), "healed", time.Second); err != nil {
		t.Errorf("new connection after Heal: %v", err)
	}
	if s := p.Stats(); s.Resets != 6 || s.Open != 1 {
		t.Errorf("Stats() = %+v; want 6 resets (2 open, then 1 open and 3 new), 1 open", s)
	}
}

func TestDrop(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.addr())
	open := dial(t, p.Addr())
	if err := roundTrip(open, "accepted", time.Second); err != nil { // not left in the backlog, which closing the listener resets
		t.Fatal(err)
	}
	p.Drop()
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial after Drop = %v; want ECONNREFUSED", err)
	}
	if err := roundTrip(open, "still", time.Second); err != nil {
		t.Errorf("an open connection after Drop: %v; want it working", err)
	}
	p.Drop() // twice is fine
	if err := p.Heal(); err != nil {
		t.Fatalf("Heal() = %v", err)
	}
	if err := roundTrip(dial(t, p.Addr()), "back", time.Second); err != nil {
		t.Errorf("dial after Heal: %v; want the same address listening again", err)
	}
}

func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	p := startProxy(t, addr) // while ln holds the port, so that the proxy gets another one
	ln.Close()               // nobody listens there
	// The proxy accepts, fails to connect and resets: on loopback that can
	// be so quick that the client's own connect already reports it.
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err == nil {
		defer c.Close()
		err = roundTrip(c, "x", 2*time.Second)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Errorf("connection to a target that refuses = %v; want it reset", err)
	}
}

func TestClose(t *testing.T) {
	defer leakcheck.VerifyNone(t)
	e := startEcho(t)
	p, err := faultproxy.Start(e.addr())
	if err != nil {
		t.Fatal(err)
	}
	// Connections in every state: forwarding, held in a black hole,
	// waiting to be connected, and delayed.
	live, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := roundTrip(live, "x", time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour)
	fmt.Fprintln(live, "delayed")
	p.Blackhole()
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	fmt.Fprintln(held, "held")
	waitFor(t, func() bool { return p.Stats().Open == 2 }, "2 open connections")

	if err := p.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	for _, c := range []net.Conn{live, held} {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("read after Close = %v; want the connection closed", err)
		}
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("dial after Close succeeded; want refused")
	}
	if err := p.Close(); !errors.Is(err, faultproxy.ErrClosed) {
		t.Errorf("second Close() = %v; want ErrClosed", err)
	}
	if err := p.Heal(); !errors.Is(err, faultproxy.ErrClosed) {
		t.Errorf("Heal() after Close = %v; want ErrClosed", err)
	}
	p.Blackhole()
	p.Reset()
	p.ResetUntilHeal()
	p.Drop()
	p.SetLatency(time.Second)
	e.close()
}

// Many clients echo while faults come and go at random; afterwards, healed,
// every connection works again, and Close leaves no goroutine behind.
func TestConcurrentFaults(t *testing.T) {
	defer leakcheck.VerifyNone(t)
	e := startEcho(t)
	p, err := faultproxy.Start(e.addr())
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr(), 200*time.Millisecond)
				if err != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				for k := range 5 {
					if roundTrip(c, fmt.Sprintf("%d-%d-%d", i, j, k), 50*time.Millisecond) != nil {
						break
					}
				}
				c.Close()
			}
		}()
	}
	faults := []func(){
		func() { p.SetLatency(time.Duration(rand.IntN(20)) * time.Millisecond) },
		p.Blackhole, p.Reset, p.ResetUntilHeal, p.Drop,
		func() {
			if err := p.Heal(); err != nil {
				t.Errorf("Heal() = %v", err)
			}
		},
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		faults[rand.IntN(len(faults))]()
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	if err := roundTrip(c, "healed", time.Second); err != nil {
		t.Errorf("round trip after Heal: %v", err)
	}
	c.Close()
	if s := p.Stats(); s.Accepted < 10 {
		t.Errorf("Stats() = %+v; want some traffic", s)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	e.close()
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
