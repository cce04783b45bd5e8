// Package idemgrpctest is the conformance suite of the gRPC adapter
// (package idemgrpc): Run starts real grpc-go servers of a generated test
// service on loopback ports, guarded by the server interceptor on a store
// of the caller's, and checks replays, refusals, the error table, panics,
// a same-key storm and the retrying client interceptor. Every store runs
// it: memstore and redisstore in idemgrpc's tests, the SQL stores in the
// integration module.
package idemgrpctest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgrpc"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/internal/paypb"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// ChargeMethod is the full method name of the test service's Charge.
const ChargeMethod = paypb.Pay_Charge_FullMethodName

// payServer is the test service: Charge counts its executions and asks
// the test's charge func for its answer.
type payServer struct {
	paypb.UnimplementedPayServer
	executions atomic.Int64
	charge     func(ctx context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error)
}

func (p *payServer) Charge(ctx context.Context, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
	n := p.executions.Add(1)
	if p.charge != nil {
		return p.charge(ctx, n, req)
	}
	return okReply(n, req), nil
}

func (p *payServer) Get(_ context.Context, req *paypb.GetRequest) (*paypb.ChargeReply, error) {
	return &paypb.ChargeReply{ChargeId: req.GetChargeId()}, nil
}

func okReply(n int64, req *paypb.ChargeRequest) *paypb.ChargeReply {
	return &paypb.ChargeReply{ChargeId: fmt.Sprintf("ch_%d", n), Amount: req.GetAmount(), Currency: req.GetCurrency(), Execution: n}
}

// env is one server and its clients.
type env struct {
	t      *testing.T
	pay    *payServer
	plain  paypb.PayClient // no client interceptor
	client paypb.PayClient // with the retrying client interceptor, when asked for

	mu       sync.Mutex
	events   map[string]int
	keysSeen []string     // the idempotency-key of every call that reached the server
	attempts atomic.Int64 // calls that reached the server
}

type setup struct {
	server func(*idemgrpc.ServerOptions)
	client *idemgrpc.ClientOptions
	fault  grpc.UnaryServerInterceptor // between the counter and the guard
	charge func(ctx context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error)
}

// start starts a server on a loopback port with a store of newStore.
func start(t *testing.T, newStore func(*testing.T) idemstore.Store, s setup) *env {
	t.Helper()
	e := &env{t: t, pay: &payServer{charge: s.charge}, events: map[string]int{}}
	o := idemgrpc.ServerOptions{Guard: idempotency.Options[*idemgrpc.UnaryRequest]{
		Store: newStore(t),
		OnEvent: func(_ *idemgrpc.UnaryRequest, ev string) {
			e.mu.Lock()
			e.events[ev]++
			e.mu.Unlock()
		},
	}}
	if s.server != nil {
		s.server(&o)
	}
	chain := []grpc.UnaryServerInterceptor{e.count}
	if s.fault != nil {
		chain = append(chain, s.fault)
	}
	chain = append(chain, idemgrpc.UnaryServerInterceptor(o))
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	paypb.RegisterPayServer(srv, e.pay)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	e.plain = paypb.NewPayClient(dial(t, lis.Addr().String()))
	if s.client != nil {
		e.client = paypb.NewPayClient(dial(t, lis.Addr().String(), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(*s.client))))
	}
	return e
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// count is the outermost server interceptor: it counts the calls that
// reach the server and their keys, and turns a panic into INTERNAL (a
// recovery interceptor, as a real server has one).
func (e *env) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	e.attempts.Add(1)
	e.mu.Lock()
	e.keysSeen = append(e.keysSeen, first(metadata.ValueFromIncomingContext(ctx, idemgrpc.KeyMetadata)))
	e.mu.Unlock()
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

func (e *env) event(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.events[name]
}

func (e *env) keys() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.keysSeen...)
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// withKey returns ctx with key as the call's idempotency-key metadata.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.KeyMetadata, key)
}

// answer is one call's result.
type answer struct {
	reply   *paypb.ChargeReply
	err     error
	header  metadata.MD
	trailer metadata.MD
}

func (a answer) replayed() bool { return idemgrpc.IsReplayed(a.header, a.trailer) }

// charge calls Charge on c with key (none if "").
func (e *env) charge(ctx context.Context, c paypb.PayClient, key string, req *paypb.ChargeRequest, opts ...grpc.CallOption) answer {
	if key != "" {
		ctx = withKey(ctx, key)
	}
	var a answer
	a.reply, a.err = c.Charge(ctx, req, append(opts, grpc.Header(&a.header), grpc.Trailer(&a.trailer))...)
	return a
}

// waitFor waits until cond holds, or fails the test after a generous
// time: it synchronises with the server's state, it measures nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
