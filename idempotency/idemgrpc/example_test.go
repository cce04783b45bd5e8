package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgrpc"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/internal/paypb"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// payments is a Pay service (generated from a .proto with protoc-gen-go
// and protoc-gen-go-grpc) that counts the charges it makes.
type payments struct {
	paypb.UnimplementedPayServer
	charges int64
}

func (p *payments) Charge(ctx context.Context, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
	p.charges++ // a real one moves money here, under a unique constraint on the key
	return &paypb.ChargeReply{ChargeId: fmt.Sprint("ch_", p.charges), Amount: req.Amount, Currency: req.Currency}, nil
}

// serve starts srv on a loopback port and returns its address.
func serve(srv *grpc.Server) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String()
}

// The server guards Charge: a retry with the same idempotency-key gets
// the first reply, with the header idempotent-replayed: true, and the
// charge is made once.
func ExampleUnaryServerInterceptor() {
	pay := &payments{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(idemgrpc.ServerOptions{
		Guard:   idempotency.Options[*idemgrpc.UnaryRequest]{Store: &memstore.Store{}},
		Methods: []string{paypb.Pay_Charge_FullMethodName},
	})))
	paypb.RegisterPayServer(srv, pay)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///"+serve(srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := paypb.NewPayClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "order-1138")
	for range 2 {
		var header metadata.MD
		reply, err := client.Charge(ctx, &paypb.ChargeRequest{Amount: 1250, Currency: "EUR"}, grpc.Header(&header))
		fmt.Println(reply.GetChargeId(), err, header.Get("idempotent-replayed"))
	}
	fmt.Println("charges:", pay.charges)
	// Output:
	// ch_1 <nil> []
	// ch_1 <nil> [true]
	// charges: 1
}

// The client gives each call one key and retries it with that key where
// it is safe; a later call for the same intent passes the same key
// (WithKey) and gets the first reply, marked as replayed.
func ExampleUnaryClientInterceptor() {
	pay := &payments{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(idemgrpc.ServerOptions{
		Guard:   idempotency.Options[*idemgrpc.UnaryRequest]{Store: &memstore.Store{}}, // or redisstore, sqlstore
		Methods: []string{paypb.Pay_Charge_FullMethodName},                             // nil: every unary method
	})))
	paypb.RegisterPayServer(srv, pay)
	defer srv.Stop()
	addr := serve(srv)

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{
			Methods: []string{paypb.Pay_Charge_FullMethodName},
		})))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := paypb.NewPayClient(conn)
	ctx := idemgrpc.WithKey(context.Background(), "order-1138") // one key per intent, kept
	for range 2 {
		var replayed bool
		reply, err := client.Charge(ctx, &paypb.ChargeRequest{Amount: 1250, Currency: "EUR"}, idemgrpc.Replayed(&replayed))
		fmt.Println(reply.GetChargeId(), err, replayed)
	}
	fmt.Println("charges:", pay.charges)
	// Output:
	// ch_1 <nil> false
	// ch_1 <nil> true
	// charges: 1
}
