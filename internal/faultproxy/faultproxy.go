// Package faultproxy is a TCP proxy that tests put between a client and a
// server (the service and its Redis, its database, its payment provider)
// to inject network faults on command: latency, a black hole, connection
// resets and refused connections.
//
// A Proxy listens on a loopback port of its own and forwards every
// connection it accepts to one target address, byte for byte in both
// directions, until a test tells it otherwise:
//
//   - [Proxy.SetLatency] delays every byte by d in each direction (a
//     request–response round trip costs 2d more);
//   - [Proxy.Blackhole] keeps accepting connections but forwards nothing,
//     on new and open connections alike: clients see timeouts, not
//     refusals. What was sent meanwhile is held, not lost, and delivered
//     after [Proxy.Heal], as TCP's retransmissions would after a partition;
//   - [Proxy.Stall] black-holes the connections open now, for good (until
//     [Proxy.Close]), and forwards new ones as usual: a flow lost in the
//     network (a NAT or conntrack entry gone) that the client's side never
//     sees fail;
//   - [Proxy.Reset] resets (TCP RST) every open connection, on both sides;
//     [Proxy.ResetUntilHeal] also resets every new one as soon as it is
//     accepted;
//   - [Proxy.Drop] stops listening: new connections are refused, open ones
//     carry on;
//   - [Proxy.Heal] ends all of these: no latency, no black hole, no resets,
//     listening again on the same address.
//
// It uses only the standard library. All methods are safe for concurrent
// use; [Proxy.Close] ends every connection and waits for every goroutine
// the proxy started.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// dialTimeout bounds the proxy's own connection to the target.
const dialTimeout = 5 * time.Second

// chunkQueue is how many chunks a direction reads ahead of what it has
// delivered (held by latency or a black hole); then it stops reading and
// TCP's flow control pushes back on the sender.
const chunkQueue = 16

// ErrClosed is returned by methods called after [Proxy.Close].
var ErrClosed = errors.New("faultproxy: closed")

// Stats counts what a proxy did.
type Stats struct {
	Accepted int // connections accepted
	Open     int // connections open now
	Resets   int // connections reset by Reset or ResetUntilHeal
}

// Proxy forwards connections to a target and injects faults on command.
// Create it with [Start]; its methods are safe for concurrent use.
type Proxy struct {
	target string
	addr   string // the listening address, the same for the proxy's life

	mu        sync.Mutex
	ln        net.Listener // nil while dropping and after Close
	latency   time.Duration
	blackhole bool
	resetting bool
	closed    bool
	changed   chan struct{} // closed and replaced whenever the fields above change
	links     map[*link]struct{}
	stats     Stats

	wg sync.WaitGroup // every goroutine the proxy started
}

// Start listens on a free loopback port and forwards each connection to
// target (host:port). It returns an error when it cannot listen; the
// target is dialled per connection, so it need not be up yet.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, changed: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve(ln)
	return p, nil
}

// Addr is the address clients connect to instead of the target
// ("127.0.0.1:PORT").
func (p *Proxy) Addr() string { return p.addr }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	for l := range p.links {
		select {
		case <-l.dead: // ended, not yet forgotten
		default:
			s.Open++
		}
	}
	return s
}

// SetLatency delays every byte by d in each direction, on open and new
// connections (connecting takes d too). 0 removes the delay; so does Heal.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = max(d, 0)
	p.notify()
}

// Blackhole makes the proxy accept connections and forward nothing, on
// open and new connections, until Heal: clients see their reads time out.
// Bytes sent meanwhile are held and delivered after Heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = true
	p.notify()
}

// Stall makes every connection open now forward nothing more, in either
// direction, and never end until Close: what is sent on them is held for
// good. Connections accepted after it are forwarded as usual; Heal does
// not revive the stalled ones.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.stalled = true
	}
	p.notify()
}

// Reset resets every open connection: both its client and its target see
// a TCP RST. New connections are forwarded as usual.
func (p *Proxy) Reset() { p.reset(false) }

// ResetUntilHeal resets every open connection, and every new one as soon
// as it is accepted, until Heal.
func (p *Proxy) ResetUntilHeal() { p.reset(true) }

func (p *Proxy) reset(keep bool) {
	p.mu.Lock()
	if keep && !p.closed {
		p.resetting = true
		p.notify()
	}
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	n := 0
	for _, l := range links {
		if l.kill(true) { // not one that had ended already
			n++
		}
	}
	p.mu.Lock()
	p.stats.Resets += n
	p.mu.Unlock()
}

// Drop stops listening, so that new connections are refused
// (ECONNREFUSED), until Heal. Connections the proxy accepted carry on;
// those still in the kernel's accept queue are reset, as closing any
// listener does.
func (p *Proxy) Drop() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close() // serve returns
	}
}

// Heal ends every fault: no latency, no black hole (held bytes are
// delivered), no resets of new connections, and listening again after
// Drop, on the same address. It returns an error when that address cannot
// be listened on again (the other faults are healed anyway), or
// ErrClosed after Close.
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.latency, p.blackhole, p.resetting = 0, false, false
	p.notify()
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.serve(ln)
	return nil
}

// Close stops listening, closes every connection and waits until every
// goroutine of the proxy has ended. Later calls return ErrClosed.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return ErrClosed
	}
	p.closed = true
	ln := p.ln
	p.ln = nil
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.notify()
	p.mu.Unlock()
	var err error
	if ln != nil {
		err = ln.Close()
	}
	for _, l := range links {
		l.kill(false)
	}
	p.wg.Wait()
	return err
}

// notify wakes everything waiting for a change of the proxy's state. The
// caller holds p.mu.
func (p *Proxy) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// serve accepts connections on ln until it is closed (by Drop or Close).
func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: back off
			continue
		}
		p.accept(c.(*net.TCPConn))
	}
}

func (p *Proxy) accept(c *net.TCPConn) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.stats.Accepted++
	if p.resetting {
		p.stats.Resets++
		p.mu.Unlock()
		rst(c)
		return
	}
	l := &link{p: p, client: c, dead: make(chan struct{})}
	p.links[l] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go l.run(time.Now())
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// await blocks until something that arrived at `at` may be delivered: no
// black hole, and the latency has passed since. It reports false when the
// link ended first.
func (p *Proxy) await(l *link, at time.Time) bool {
	for {
		p.mu.Lock()
		blackhole, latency, changed := p.blackhole || l.stalled, p.latency, p.changed
		p.mu.Unlock()
		var due <-chan time.Time
		var timer *time.Timer
		if !blackhole {
			wait := time.Until(at.Add(latency))
			if wait <= 0 {
				return true
			}
			timer = time.NewTimer(wait)
			due = timer.C
		}
		select {
		case <-due:
			return true
		case <-changed: // look again: healed, or the latency changed
		case <-l.dead:
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-l.dead:
			return false
		default:
		}
	}
}

// rst closes c with a TCP RST instead of a FIN.
func rst(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// link is one proxied connection: the client's, and the proxy's own to
// the target.
type link struct {
	p       *Proxy
	client  *net.TCPConn
	stalled bool // by Stall; guarded by p.mu

	mu     sync.Mutex
	server *net.TCPConn // nil until dialled

	dead     chan struct{} // closed by kill
	killOnce sync.Once
}

// kill closes both sides of l, with RST when reset is set, and wakes
// everything that waits for l. It reports whether this call ended l.
func (l *link) kill(reset bool) (killed bool) {
	l.killOnce.Do(func() {
		killed = true
		l.mu.Lock()
		close(l.dead)
		server := l.server
		l.mu.Unlock()
		for _, c := range []*net.TCPConn{l.client, server} {
			switch {
			case c == nil:
			case reset:
				rst(c)
			default:
				_ = c.Close()
			}
		}
	})
	return killed
}

// run connects to the target (once the proxy lets anything through) and
// forwards both directions until both end.
func (l *link) run(accepted time.Time) {
	defer l.p.wg.Done()
	defer l.p.forget(l)
	if !l.p.await(l, accepted) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	watched := make(chan struct{})
	go func() { // the link's death cancels the dial
		defer close(watched)
		select {
		case <-l.dead:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", l.p.target)
	cancel()
	<-watched
	if err != nil {
		l.kill(true) // the client sees a reset: the nearest a proxy gets to the target's refusal
		return
	}
	server := c.(*net.TCPConn)
	l.mu.Lock()
	select {
	case <-l.dead: // killed while dialling
		l.mu.Unlock()
		rst(server)
		return
	default:
		l.server = server
	}
	l.mu.Unlock()

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, d := range [][2]*net.TCPConn{{l.client, server}, {server, l.client}} {
		chunks := make(chan chunk, chunkQueue)
		wg.Add(2)
		go func() {
			defer wg.Done()
			l.read(d[0], chunks)
		}()
		go func() {
			defer wg.Done()
			errs <- l.write(d[1], chunks)
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			l.kill(true) // a reset on one side resets the other; so does a fault
		}
	}
	l.kill(false)
	wg.Wait()
}

// chunk is what one read returned, and when.
type chunk struct {
	data []byte
	err  error // io.EOF: the sender closed its side
	at   time.Time
}

// read reads src until it fails or l dies, queueing what it reads.
func (l *link) read(src *net.TCPConn, chunks chan<- chunk) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case chunks <- chunk{data: append([]byte(nil), buf[:n]...), at: time.Now()}:
			case <-l.dead:
				return
			}
		}
		if err != nil {
			select {
			case chunks <- chunk{err: err, at: time.Now()}:
			case <-l.dead:
			}
			return
		}
	}
}

var errLinkDead = errors.New("faultproxy: connection ended")

// write delivers the queued chunks to dst, each when the proxy lets it
// through. A clean end of the other side is passed on as a half-close
// (nil); anything else is an error.
func (l *link) write(dst *net.TCPConn, chunks <-chan chunk) error {
	for {
		var c chunk
		select {
		case c = <-chunks:
		case <-l.dead:
			return errLinkDead
		}
		if !l.p.await(l, c.at) {
			return errLinkDead
		}
		if c.err != nil {
			if errors.Is(c.err, io.EOF) {
				_ = dst.CloseWrite()
				return nil
			}
			return c.err
		}
		if _, err := dst.Write(c.data); err != nil {
			return err
		}
	}
}

// Front starts a Proxy to rawURL's host (a database or Redis URL) for the
// rest of t, healed and closed when t ends, and returns rawURL through it.
func Front(t testing.TB, rawURL string) (string, *Proxy) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	p, err := Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Heal(); _ = p.Close() })
	u.Host = p.Addr()
	return u.String(), p
}
