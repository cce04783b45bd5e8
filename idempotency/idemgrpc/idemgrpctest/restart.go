package idemgrpctest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgrpc"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/internal/paypb"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// relay is a loopback port whose connections go to the server serving
// its current view, and are closed while none does (the server is down):
// servers stop and start on one address without giving the port up.
type relay struct {
	ln  net.Listener
	mu  sync.Mutex
	cur *view
}

func newRelay(t *testing.T) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			v := r.cur
			r.mu.Unlock()
			if v == nil {
				_ = c.Close() // down: the client sees the connection fail
				continue
			}
			select {
			case v.conns <- c:
			case <-v.done:
				_ = c.Close()
			}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return r
}

// view returns a listener for the next server; its Close stops only that
// server's accepting.
func (r *relay) view() net.Listener {
	v := &view{r: r, conns: make(chan net.Conn), done: make(chan struct{})}
	r.mu.Lock()
	r.cur = v
	r.mu.Unlock()
	return v
}

type view struct {
	r     *relay
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (v *view) Accept() (net.Conn, error) {
	select {
	case c := <-v.conns:
		return c, nil
	case <-v.done:
		return nil, net.ErrClosed
	}
}

func (v *view) Close() error {
	v.once.Do(func() {
		close(v.done)
		v.r.mu.Lock()
		if v.r.cur == v {
			v.r.cur = nil
		}
		v.r.mu.Unlock()
	})
	return nil
}

func (v *view) Addr() net.Addr { return v.r.ln.Addr() }

// The server is down when the call starts (connections refused at once),
// comes up, runs the charge and dies before its answer leaves; a new
// server on the same store comes up. The client's retries, all with one
// key, get the replay: the charge ran once.
func testClientServerRestart(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	pay := &payServer{}
	guard := idemgrpc.UnaryServerInterceptor(idemgrpc.ServerOptions{Guard: idempotency.Options[*idemgrpc.UnaryRequest]{Store: newStore(t)}})
	r := newRelay(t)
	var (
		mu      sync.Mutex
		servers []*grpc.Server
		keys    []string
		wg      sync.WaitGroup
	)
	t.Cleanup(func() {
		mu.Lock()
		for _, s := range servers {
			s.Stop()
		}
		mu.Unlock()
		wg.Wait()
	})
	serve := func(interceptors ...grpc.UnaryServerInterceptor) *grpc.Server {
		record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			mu.Lock()
			keys = append(keys, first(metadata.ValueFromIncomingContext(ctx, idemgrpc.KeyMetadata)))
			mu.Unlock()
			return h(ctx, req)
		}
		srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{record}, append(interceptors, guard)...)...))
		paypb.RegisterPayServer(srv, pay)
		mu.Lock()
		servers = append(servers, srv)
		mu.Unlock()
		lis := r.view()
		wg.Go(func() { _ = srv.Serve(lis) })
		return srv
	}
	var srv1 atomic.Pointer[grpc.Server]
	// The first server dies once the guard stored its answer, before the
	// answer is sent; the second one is started in its place.
	var died atomic.Bool
	die := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if died.CompareAndSwap(false, true) {
			go srv1.Load().Stop()
			<-ctx.Done() // the connection is gone: this answer is lost
			serve()
		}
		return resp, err
	}

	// Up on the client's first failed attempt.
	var attempts, up atomic.Int64
	observe := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		attempts.Add(1)
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.Unavailable && up.Add(1) == 1 {
			srv1.Store(serve(die))
		}
		return err
	}
	conn, err := grpc.NewClient("passthrough:///"+r.ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{ // reconnect quickly after the server is back
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{
			MaxAttempts: 1000, MaxElapsed: 30 * time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		}), observe))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	var replayed bool
	var key string
	reply, err := paypb.NewPayClient(conn).Charge(t.Context(), charge(300), idemgrpc.Replayed(&replayed), idemgrpc.SentKey(&key))
	if err != nil {
		t.Fatalf("after %d attempts: %v", attempts.Load(), err)
	}
	if !died.Load() || !replayed || reply.GetExecution() != 1 {
		t.Errorf("reply %v, replayed %v, the first server died %v; want the first run's reply, replayed", reply, replayed, died.Load())
	}
	if n := pay.executions.Load(); n != 1 {
		t.Errorf("the charge ran %d times; want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) < 2 {
		t.Errorf("the servers saw %d calls; want the lost one and the replayed one", len(keys))
	}
	for _, k := range keys {
		if k != key || k == "" {
			t.Errorf("the servers saw keys %q; want only %q", keys, key)
			break
		}
	}
}
