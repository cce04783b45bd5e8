package idemgrpc_test

import (
	"context"
	"net"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgrpc"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/internal/paypb"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// What the server interceptor adds to a trivial handler on the memory
// store (docs/adapters-grpc.md has the table): run with -benchmem and
// subtract .../bare from .../first and .../replay. BenchmarkInterceptor
// calls the interceptor in process (what it costs itself, next to
// idempotency's BenchmarkMiddleware*); BenchmarkLoopback makes real calls
// to a grpc-go server on a loopback port (what a caller sees). Every
// harness builds the call's incoming metadata the same way, bare
// included, so the differences are the interceptor's alone.

var benchInfo = &grpc.UnaryServerInfo{FullMethod: paypb.Pay_Charge_FullMethodName}

func benchReq() *paypb.ChargeRequest { return &paypb.ChargeRequest{Amount: 1000, Currency: "EUR"} }

func benchHandler(_ context.Context, req any) (any, error) {
	r := req.(*paypb.ChargeRequest)
	return &paypb.ChargeReply{ChargeId: "ch_1", Amount: r.Amount, Currency: r.Currency, Execution: 1}, nil
}

func BenchmarkInterceptor(b *testing.B) {
	fresh := func(i int) string { return "key-" + strconv.Itoa(i) }
	same := func(int) string { return "same" }
	bare := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	guard := func() grpc.UnaryServerInterceptor {
		return idemgrpc.UnaryServerInterceptor(idemgrpc.ServerOptions{Guard: idempotency.Options[*idemgrpc.UnaryRequest]{Store: &memstore.Store{}}})
	}
	b.Run("bare", func(b *testing.B) { benchIntercept(b, bare, fresh) })
	b.Run("first", func(b *testing.B) { benchIntercept(b, guard(), fresh) })
	b.Run("replay", func(b *testing.B) { benchIntercept(b, guard(), same) })
}

// stream is the call's server transport stream, as grpc-go puts one in
// a handler's context: it keeps the header set.
type stream struct{ header metadata.MD }

func (*stream) Method() string                    { return benchInfo.FullMethod }
func (s *stream) SetHeader(md metadata.MD) error  { s.header = md; return nil }
func (s *stream) SendHeader(md metadata.MD) error { s.header = md; return nil }
func (*stream) SetTrailer(metadata.MD) error      { return nil }

func benchIntercept(b *testing.B, icpt grpc.UnaryServerInterceptor, key func(int) string) {
	req := benchReq()
	st := &stream{}
	ctx := grpc.NewContextWithServerTransportStream(b.Context(), st)
	b.ReportAllocs()
	var resp any
	var err error
	for i := 0; b.Loop(); i++ {
		c := metadata.NewIncomingContext(ctx, metadata.MD{idemgrpc.KeyMetadata: {key(i)}})
		if resp, err = icpt(c, req, benchInfo, benchHandler); err != nil {
			b.Fatal(err)
		}
	}
	if r, _ := resp.(*paypb.ChargeReply); r.GetChargeId() != "ch_1" {
		b.Fatalf("last answer %v", resp)
	}
}

type benchPay struct{ paypb.UnimplementedPayServer }

func (benchPay) Charge(ctx context.Context, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
	r, err := benchHandler(ctx, req)
	return r.(*paypb.ChargeReply), err
}

func BenchmarkLoopback(b *testing.B) {
	fresh := func(i int) string { return "key-" + strconv.Itoa(i) }
	same := func(int) string { return "same" }
	guard := grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(idemgrpc.ServerOptions{Guard: idempotency.Options[*idemgrpc.UnaryRequest]{Store: &memstore.Store{}}}))
	b.Run("bare", func(b *testing.B) { benchLoopback(b, nil, fresh) })
	b.Run("first", func(b *testing.B) { benchLoopback(b, guard, fresh) })
	b.Run("replay", func(b *testing.B) { benchLoopback(b, guard, same) })
}

func benchLoopback(b *testing.B, opt grpc.ServerOption, key func(int) string) {
	var opts []grpc.ServerOption
	if opt != nil {
		opts = append(opts, opt)
	}
	srv := grpc.NewServer(opts...)
	paypb.RegisterPayServer(srv, benchPay{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := paypb.NewPayClient(conn)
	req := benchReq()
	ctx := b.Context()
	want, _ := benchHandler(ctx, req)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		reply, err := c.Charge(metadata.AppendToOutgoingContext(ctx, idemgrpc.KeyMetadata, key(i)), req)
		if err != nil {
			b.Fatal(err)
		}
		if !proto.Equal(reply, want.(proto.Message)) {
			b.Fatalf("answer %v; want %v", reply, want)
		}
	}
}
