package idemgrpctest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgrpc"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/internal/paypb"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Run runs the suite. newStore returns the store of one server: a fresh
// one, or one of its own keys (each server's calls use keys of their own,
// so a shared store works too). Stores with a repeat-submit window
// (idemstore.WindowStore) run the window's tests; others skip them.
func Run(t *testing.T, newStore func(t *testing.T) idemstore.Store) {
	tests := []struct {
		name string
		fn   func(*testing.T, func(*testing.T) idemstore.Store)
	}{
		{"Replay", testReplay},
		{"DeterministicFingerprint", testDeterministic},
		{"InFlight", testInFlight},
		{"Mismatch", testMismatch},
		{"KeyMissingInvalid", testKeyMissingInvalid},
		{"KeyOptional", testKeyOptional},
		{"RequestID", testRequestID},
		{"RequestIDNotFingerprinted", testRequestIDWindow},
		{"UnguardedMethod", testUnguarded},
		{"HandlerErrors", testHandlerErrors},
		{"LeaseEndsHandlerContext", testLeaseEnds},
		{"StoreServerErrors", testStoreServerErrors},
		{"Panic", testPanic},
		{"Principal", testPrincipal},
		{"SubmitTokens", testSubmitTokens},
		{"StoreUnavailable", testStoreUnavailable},
		{"MessageTooLarge", testTooLarge},
		{"MarkFirstExpiry", testMarkFirstExpiry},
		{"Storm", testStorm},
		{"StormWait", testStormWait},
		{"ClientRetriesLostAnswer", testClientLostAnswer},
		{"ClientRetriesUnavailable", testClientUnavailable},
		{"ClientServerRestart", testClientServerRestart},
		{"ClientRetriesInProgress", testClientInProgress},
		{"ClientDuplicateSubmission", testClientDuplicate},
		{"ClientResourceExhausted", testClientResourceExhausted},
		{"ClientExhausted", testClientExhausted},
		{"ClientDeadline", testClientDeadline},
		{"ClientKeys", testClientKeys},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore) })
	}
}

func charge(amount int64) *paypb.ChargeRequest {
	return &paypb.ChargeRequest{Amount: amount, Currency: "EUR"}
}

// details returns err's ErrorInfo and RetryInfo (nil if absent).
func details(err error) (*errdetails.ErrorInfo, *errdetails.RetryInfo) {
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	return info, retry
}

// wantRefusal checks that err is code with an ErrorInfo of reason (domain
// onceguard) and, when retry > 0, a RetryInfo of retry; none when 0.
func wantRefusal(t *testing.T, what string, err error, code codes.Code, reason string, retry time.Duration) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("%s: code %v (%v); want %v", what, got, err, code)
	}
	info, ri := details(err)
	if info == nil || info.GetReason() != reason || info.GetDomain() != idemgrpc.Domain {
		t.Errorf("%s: ErrorInfo %v; want reason %q, domain %q", what, info, reason, idemgrpc.Domain)
	}
	switch {
	case retry == 0 && ri != nil:
		t.Errorf("%s: RetryInfo %v; want none", what, ri)
	case retry > 0 && (ri == nil || ri.GetRetryDelay().AsDuration() != retry):
		t.Errorf("%s: RetryInfo %v; want a delay of %v", what, ri, retry)
	}
}

func wantExecutions(t *testing.T, e *env, n int64) {
	t.Helper()
	if got := e.pay.executions.Load(); got != n {
		t.Errorf("the handler ran %d times; want %d", got, n)
	}
}

// A retry gets the first answer, the same message, marked as replayed,
// and the handler runs once.
func testReplay(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{})
	ctx := t.Context()
	a1 := e.charge(ctx, e.plain, "k-replay", charge(1250))
	if a1.err != nil {
		t.Fatal(a1.err)
	}
	if a1.replayed() || len(a1.header[idemgrpc.ReplayedMetadata]) != 0 {
		t.Errorf("first answer's header %v; want no %s", a1.header, idemgrpc.ReplayedMetadata)
	}
	a2 := e.charge(ctx, e.plain, "k-replay", charge(1250))
	if a2.err != nil {
		t.Fatal(a2.err)
	}
	if !proto.Equal(a1.reply, a2.reply) {
		t.Errorf("replay %v; want %v", a2.reply, a1.reply)
	}
	if got := a2.header[idemgrpc.ReplayedMetadata]; len(got) != 1 || got[0] != "true" {
		t.Errorf("replay's header %s = %q; want [true]", idemgrpc.ReplayedMetadata, got)
	}
	wantExecutions(t, e, 1)
	if e.event("replayed") != 1 || e.event("new") != 1 {
		t.Errorf("events %v; want one new, one replayed", e.events)
	}
}

// The fingerprint is of the deterministic encoding: a map built in
// another order is the same request.
func testDeterministic(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{})
	ctx := t.Context()
	req := func(reverse bool) *paypb.ChargeRequest {
		r := charge(99)
		r.Labels = map[string]string{}
		for i := range 64 {
			j := i
			if reverse {
				j = 63 - i
			}
			r.Labels[fmt.Sprintf("label-%02d", j)] = strings.Repeat("v", j)
		}
		return r
	}
	for i := range 4 {
		a := e.charge(ctx, e.plain, "k-det", req(i%2 == 1))
		if a.err != nil {
			t.Fatalf("call %d: %v", i+1, a.err)
		}
		if i > 0 && !a.replayed() {
			t.Errorf("call %d is not a replay", i+1)
		}
	}
	wantExecutions(t, e, 1)
}

// A retry while the first call runs gets ABORTED with a RetryInfo; once
// the first is done, its answer.
func testInFlight(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	started, release := make(chan struct{}), make(chan struct{})
	e := start(t, newStore, setup{charge: func(ctx context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
		close(started)
		<-release
		return okReply(n, req), nil
	}})
	ctx := t.Context()
	done := make(chan answer, 1)
	go func() { done <- e.charge(ctx, e.plain, "k-flight", charge(5)) }()
	<-started
	a := e.charge(ctx, e.plain, "k-flight", charge(5))
	wantRefusal(t, "retry in flight", a.err, codes.Aborted, "request_in_progress", time.Second)
	close(release)
	a1 := <-done
	if a1.err != nil {
		t.Fatal(a1.err)
	}
	a3 := e.charge(ctx, e.plain, "k-flight", charge(5))
	if a3.err != nil || !proto.Equal(a3.reply, a1.reply) || !a3.replayed() {
		t.Errorf("after the first: %v, %v, replayed %v; want the first answer, replayed", a3.reply, a3.err, a3.replayed())
	}
	wantExecutions(t, e, 1)
}

// The same key with another request is FAILED_PRECONDITION.
func testMismatch(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{})
	ctx := t.Context()
	if a := e.charge(ctx, e.plain, "k-mis", charge(100)); a.err != nil {
		t.Fatal(a.err)
	}
	a := e.charge(ctx, e.plain, "k-mis", charge(200))
	wantRefusal(t, "another request", a.err, codes.FailedPrecondition, "idempotency_key_reused", 0)
	other := charge(100)
	other.Currency = "USD"
	a = e.charge(ctx, e.plain, "k-mis", other)
	wantRefusal(t, "another currency", a.err, codes.FailedPrecondition, "idempotency_key_reused", 0)
	wantExecutions(t, e, 1)
}

// No key, or one that is not a key, is INVALID_ARGUMENT, and nothing runs.
func testKeyMissingInvalid(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{})
	ctx := t.Context()
	a := e.charge(ctx, e.plain, "", charge(1))
	wantRefusal(t, "no key", a.err, codes.InvalidArgument, "idempotency_key_missing", 0)
	a = e.charge(ctx, e.plain, strings.Repeat("k", 256), charge(1))
	wantRefusal(t, "a 256-character key", a.err, codes.InvalidArgument, "idempotency_key_invalid", 0)
	a = e.charge(withKey(ctx, "one"), e.plain, "two", charge(1))
	wantRefusal(t, "two keys", a.err, codes.InvalidArgument, "idempotency_key_invalid", 0)
	r := charge(1)
	r.RequestId = "has space"
	a = e.charge(ctx, e.plain, "", r)
	wantRefusal(t, "a request_id that is no key", a.err, codes.InvalidArgument, "idempotency_key_invalid", 0)
	wantExecutions(t, e, 0)
}

// KeyOptional: a call without a key runs, unprotected, each time; one
// with a key is guarded as always.
func testKeyOptional(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{server: func(o *idemgrpc.ServerOptions) { o.Guard.KeyOptional = true }})
	ctx := t.Context()
	for range 2 {
		if a := e.charge(ctx, e.plain, "", charge(2)); a.err != nil || a.replayed() {
			t.Fatalf("no key: %v, replayed %v; want a run", a.err, a.replayed())
		}
	}
	e.charge(ctx, e.plain, "k-opt", charge(2))
	if a := e.charge(ctx, e.plain, "k-opt", charge(2)); a.err != nil || !a.replayed() {
		t.Errorf("a key on a KeyOptional route: %v, replayed %v; want the replay", a.err, a.replayed())
	}
	wantExecutions(t, e, 3)
	if e.event("unprotected") != 2 {
		t.Errorf("events %v; want two unprotected", e.events)
	}
}

// AIP-155: without metadata, request_id is the key; metadata wins, and
// then request_id is part of the request.
func testRequestID(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{})
	ctx := t.Context()
	req := func(id string, amount int64) *paypb.ChargeRequest {
		r := charge(amount)
		r.RequestId = id
		return r
	}
	a1 := e.charge(ctx, e.plain, "", req("req-1", 10))
	a2 := e.charge(ctx, e.plain, "", req("req-1", 10))
	if a1.err != nil || a2.err != nil {
		t.Fatal(a1.err, a2.err)
	}
	if !proto.Equal(a1.reply, a2.reply) || !a2.replayed() {
		t.Errorf("the same request_id: %v then %v (replayed %v); want a replay", a1.reply, a2.reply, a2.replayed())
	}
	a := e.charge(ctx, e.plain, "", req("req-1", 11))
	wantRefusal(t, "request_id with another request", a.err, codes.FailedPrecondition, "idempotency_key_reused", 0)
	if a := e.charge(ctx, e.plain, "", req("req-2", 10)); a.err != nil || a.replayed() {
		t.Errorf("another request_id: %v, replayed %v; want a first run", a.err, a.replayed())
	}
	wantExecutions(t, e, 2)

	// Metadata wins: request_id is then a field like any other.
	if a := e.charge(ctx, e.plain, "k-md", req("x", 10)); a.err != nil {
		t.Fatal(a.err)
	}
	a = e.charge(ctx, e.plain, "k-md", req("y", 10))
	wantRefusal(t, "metadata key, another request_id", a.err, codes.FailedPrecondition, "idempotency_key_reused", 0)
	wantExecutions(t, e, 3)

	// RequestIDField "-" reads no field.
	off := start(t, newStore, setup{server: func(o *idemgrpc.ServerOptions) { o.RequestIDField = "-" }})
	a = off.charge(ctx, off.plain, "", req("req-1", 10))
	wantRefusal(t, `RequestIDField "-"`, a.err, codes.InvalidArgument, "idempotency_key_missing", 0)
}

// request_id is left out of the fingerprint when it is the key: the same
// charge under two request_ids is a duplicate submission, ALREADY_EXISTS
// without RetryInfo.
func testRequestIDWindow(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	if _, ok := newStore(t).(idemstore.WindowStore); !ok {
		t.Skip("the store has no repeat-submit window")
	}
	e := start(t, newStore, setup{server: func(o *idemgrpc.ServerOptions) { o.Guard.Window = time.Minute }})
	ctx := t.Context()
	r1 := charge(77)
	r1.RequestId = "req-a"
	if a := e.charge(ctx, e.plain, "", r1); a.err != nil {
		t.Fatal(a.err)
	}
	r2 := charge(77)
	r2.RequestId = "req-b"
	a := e.charge(ctx, e.plain, "", r2)
	wantRefusal(t, "the same charge under another request_id", a.err, codes.AlreadyExists, "duplicate_submission", 0)
	if info, _ := details(a.err); info.GetMetadata()["retry_after_seconds"] == "" {
		t.Errorf("ErrorInfo %v; want retry_after_seconds", info)
	}
	a = e.charge(ctx, e.plain, "k-window", charge(77)) // a metadata key, no request_id: the same request
	wantRefusal(t, "the same charge under a metadata key", a.err, codes.AlreadyExists, "duplicate_submission", 0)
	wantExecutions(t, e, 1)
}

// Only the listed methods are guarded.
func testUnguarded(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{server: func(o *idemgrpc.ServerOptions) { o.Methods = []string{ChargeMethod} }})
	ctx := t.Context()
	if _, err := e.plain.Get(ctx, &paypb.GetRequest{ChargeId: "ch_1"}); err != nil {
		t.Errorf("Get, not listed, without a key: %v; want it to pass", err)
	}
	a := e.charge(ctx, e.plain, "", charge(1))
	wantRefusal(t, "Charge, listed, without a key", a.err, codes.InvalidArgument, "idempotency_key_missing", 0)

	all := start(t, newStore, setup{})
	_, err := all.plain.Get(ctx, &paypb.GetRequest{ChargeId: "ch_1"})
	wantRefusal(t, "Get under Methods nil (all), without a key", err, codes.InvalidArgument, "idempotency_key_missing", 0)
}

// storedCodes are the handler's codes stored and replayed; freedCodes
// free the key (the package documentation's table).
var (
	storedCodes = []codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.NotFound,
		codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated}
	freedCodes = []codes.Code{codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.Internal, codes.Unavailable,
		codes.Unimplemented, codes.DataLoss, codes.Aborted, codes.ResourceExhausted}
)

// handlerError is the status a handler answers with in the error tests:
// code, with a detail, so that a replay can be compared whole.
func handlerError(c codes.Code) error {
	st, err := status.New(c, "refused: "+c.String()).WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: c.String()}},
	})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// A handler's client-side error is stored and replayed (code, message,
// details); a server-side or transient one frees the key.
// PITFALLS 17: the handler's context ends at nine tenths of the key's
// lease (cause idempotency.ErrLeaseEnding), so that a handler honouring
// it stops before a retry may take the key over; its DEADLINE_EXCEEDED
// frees the key.
func testLeaseEnds(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	var (
		mu     sync.Mutex
		causes []error
	)
	e := start(t, newStore, setup{
		server: func(o *idemgrpc.ServerOptions) { o.Guard.Lease = 300 * time.Millisecond },
		charge: func(ctx context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
			if n == 2 {
				return okReply(n, req), nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(4 * time.Second):
			}
			mu.Lock()
			causes = append(causes, context.Cause(ctx))
			mu.Unlock()
			return nil, status.FromContextError(ctx.Err()).Err()
		}})
	ctx := t.Context()
	if a := e.charge(ctx, e.plain, "k-lease", charge(5)); status.Code(a.err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v; want DeadlineExceeded", a.err)
	}
	mu.Lock()
	if len(causes) != 1 || !errors.Is(causes[0], idempotency.ErrLeaseEnding) {
		t.Errorf("the handler's context ended with %v; want ErrLeaseEnding", causes)
	}
	mu.Unlock()
	if a := e.charge(ctx, e.plain, "k-lease", charge(5)); a.err != nil || a.replayed() {
		t.Errorf("retry: %v (replayed %v); want a new run", a.err, a.replayed())
	}
	wantExecutions(t, e, 2)
}

func testHandlerErrors(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	for _, c := range append(append([]codes.Code(nil), storedCodes...), freedCodes...) {
		t.Run(c.String(), func(t *testing.T) {
			e := start(t, newStore, setup{charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
				if n == 1 {
					return nil, handlerError(c)
				}
				return okReply(n, req), nil
			}})
			ctx := t.Context()
			a1 := e.charge(ctx, e.plain, "k-err", charge(3))
			if status.Code(a1.err) != c {
				t.Fatalf("first call: %v; want %v", a1.err, c)
			}
			a2 := e.charge(ctx, e.plain, "k-err", charge(3))
			if stored := !contains(freedCodes, c); stored {
				if !proto.Equal(status.Convert(a2.err).Proto(), status.Convert(a1.err).Proto()) || !a2.replayed() {
					t.Errorf("retry: %v (replayed %v); want the first status %v, replayed", a2.err, a2.replayed(), a1.err)
				}
				wantExecutions(t, e, 1)
			} else {
				if a2.err != nil || a2.replayed() {
					t.Errorf("retry: %v (replayed %v); want a new run", a2.err, a2.replayed())
				}
				wantExecutions(t, e, 2)
				if e.event("released") != 1 {
					t.Errorf("events %v; want one released", e.events)
				}
			}
		})
	}
	t.Run("PlainError", func(t *testing.T) { // UNKNOWN: freed
		e := start(t, newStore, setup{charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
			if n == 1 {
				return nil, errors.New("the ledger is down")
			}
			return okReply(n, req), nil
		}})
		ctx := t.Context()
		if a := e.charge(ctx, e.plain, "k-plain", charge(3)); status.Code(a.err) != codes.Unknown {
			t.Fatalf("first call: %v; want Unknown", a.err)
		}
		if a := e.charge(ctx, e.plain, "k-plain", charge(3)); a.err != nil {
			t.Errorf("retry: %v; want a new run", a.err)
		}
		wantExecutions(t, e, 2)
	})
}

func contains(cs []codes.Code, c codes.Code) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

// StoreServerErrors keeps a server-side error as the answer; transient
// refusals are still freed.
func testStoreServerErrors(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	for _, tc := range []struct {
		code   codes.Code
		stored bool
	}{{codes.Internal, true}, {codes.Unavailable, true}, {codes.Aborted, false}} {
		t.Run(tc.code.String(), func(t *testing.T) {
			e := start(t, newStore, setup{
				server: func(o *idemgrpc.ServerOptions) { o.Guard.StoreServerErrors = true },
				charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
					if n == 1 {
						return nil, handlerError(tc.code)
					}
					return okReply(n, req), nil
				},
			})
			ctx := t.Context()
			e.charge(ctx, e.plain, "k-sse", charge(3))
			a := e.charge(ctx, e.plain, "k-sse", charge(3))
			if tc.stored {
				if status.Code(a.err) != tc.code || !a.replayed() {
					t.Errorf("retry: %v (replayed %v); want the stored %v", a.err, a.replayed(), tc.code)
				}
				wantExecutions(t, e, 1)
			} else {
				if a.err != nil {
					t.Errorf("retry: %v; want a new run", a.err)
				}
				wantExecutions(t, e, 2)
			}
		})
	}
}

// A panic frees the key (and reaches the recovery interceptor outside).
func testPanic(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
		if n == 1 {
			panic("the handler's bug")
		}
		return okReply(n, req), nil
	}})
	ctx := t.Context()
	a := e.charge(ctx, e.plain, "k-panic", charge(8))
	if status.Code(a.err) != codes.Internal || !strings.Contains(status.Convert(a.err).Message(), "the handler's bug") {
		t.Fatalf("first call: %v; want the recovery interceptor's Internal", a.err)
	}
	a = e.charge(ctx, e.plain, "k-panic", charge(8))
	if a.err != nil || a.reply.GetExecution() != 2 {
		t.Errorf("retry after the panic: %v, %v; want the second run", a.reply, a.err)
	}
	if e.event("released") != 1 {
		t.Errorf("events %v; want one released", e.events)
	}
}

// Keys are scoped to the principal: another user's call with the same
// key runs on its own; a Principal error is UNAUTHENTICATED, nothing runs.
func testPrincipal(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{server: func(o *idemgrpc.ServerOptions) {
		o.Guard.Principal = func(r *idemgrpc.UnaryRequest) (string, error) {
			user := first(metadata.ValueFromIncomingContext(r.Ctx, "x-user"))
			if user == "" {
				return "", errors.New("no user")
			}
			return user, nil
		}
	}})
	ctx := t.Context()
	alice := metadata.AppendToOutgoingContext(ctx, "x-user", "alice")
	bob := metadata.AppendToOutgoingContext(ctx, "x-user", "bob")
	a1 := e.charge(alice, e.plain, "k-shared", charge(10))
	b1 := e.charge(bob, e.plain, "k-shared", charge(10))
	a2 := e.charge(alice, e.plain, "k-shared", charge(10))
	if a1.err != nil || b1.err != nil || a2.err != nil {
		t.Fatal(a1.err, b1.err, a2.err)
	}
	if a1.reply.GetExecution() != 1 || b1.reply.GetExecution() != 2 || b1.replayed() || !a2.replayed() || !proto.Equal(a1.reply, a2.reply) {
		t.Errorf("alice %v, bob %v (replayed %v), alice again %v (replayed %v); want a run each and alice's replay",
			a1.reply, b1.reply, b1.replayed(), a2.reply, a2.replayed())
	}
	a := e.charge(ctx, e.plain, "k-shared", charge(10))
	wantRefusal(t, "no user", a.err, codes.Unauthenticated, "unauthenticated", 0)
	wantExecutions(t, e, 2)
}

// Submit tokens as keys: a token runs once and replays; an unknown or
// another user's token is FAILED_PRECONDITION; with RequireToken a plain
// key is INVALID_ARGUMENT.
func testSubmitTokens(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	full, ok := newStore(t).(idemstore.FullStore)
	if !ok {
		t.Skip("the store keeps no tokens")
	}
	tokens := token.New(full, nil)
	e := start(t, func(*testing.T) idemstore.Store { return full }, setup{server: func(o *idemgrpc.ServerOptions) {
		o.Guard.Tokens, o.Guard.Purpose, o.Guard.RequireToken = tokens, "charge", true
		o.Guard.Principal = func(r *idemgrpc.UnaryRequest) (string, error) {
			return first(metadata.ValueFromIncomingContext(r.Ctx, "x-user")), nil
		}
	}})
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "alice")
	mine, err := tokens.Issue(ctx, "alice", "charge")
	if err != nil {
		t.Fatal(err)
	}
	bobs, err := tokens.Issue(ctx, "bob", "charge")
	if err != nil {
		t.Fatal(err)
	}
	a1 := e.charge(ctx, e.plain, mine.Token, charge(40))
	a2 := e.charge(ctx, e.plain, mine.Token, charge(40))
	if a1.err != nil || a2.err != nil || !a2.replayed() || !proto.Equal(a1.reply, a2.reply) {
		t.Fatalf("a token twice: %v, %v (replayed %v); want a run and its replay", a1.err, a2.err, a2.replayed())
	}
	a := e.charge(ctx, e.plain, mine.Token, charge(41))
	wantRefusal(t, "the token for another request", a.err, codes.FailedPrecondition, "idempotency_key_reused", 0)
	a = e.charge(ctx, e.plain, "st_"+strings.Repeat("A", 32), charge(40))
	wantRefusal(t, "an unknown token", a.err, codes.FailedPrecondition, "submit_token_invalid", 0)
	a = e.charge(ctx, e.plain, bobs.Token, charge(42))
	wantRefusal(t, "another user's token", a.err, codes.FailedPrecondition, "submit_token_invalid", 0)
	a = e.charge(ctx, e.plain, "plain-key", charge(40))
	wantRefusal(t, "a plain key under RequireToken", a.err, codes.InvalidArgument, "submit_token_required", 0)
	wantExecutions(t, e, 1)
}

// downStore is a store that cannot be reached.
type downStore struct{ idemstore.Store }

func (downStore) Begin(context.Context, idemstore.BeginRequest) (idemstore.BeginResult, error) {
	return idemstore.BeginResult{}, idemstore.ErrUnavailable
}

// A store that cannot be reached is UNAVAILABLE with a RetryInfo, and
// nothing runs unprotected.
func testStoreUnavailable(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, func(t *testing.T) idemstore.Store { return downStore{newStore(t)} }, setup{})
	a := e.charge(t.Context(), e.plain, "k-down", charge(1))
	wantRefusal(t, "store down", a.err, codes.Unavailable, "store_unavailable", 2*time.Second)
	wantExecutions(t, e, 0)
}

// A request over MaxBody is RESOURCE_EXHAUSTED (as gRPC answers a message
// over its limit), and it is not a rate limit: the client does not retry.
func testTooLarge(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{client: &fastClient, server: func(o *idemgrpc.ServerOptions) { o.Guard.MaxBody = 64 }})
	big := charge(1)
	big.Currency = strings.Repeat("E", 100)
	_, err := e.client.Charge(t.Context(), big)
	wantRefusal(t, "a 100-byte message over MaxBody 64", err, codes.ResourceExhausted, "body_too_large", 0)
	if got := e.attempts.Load(); got != 1 {
		t.Errorf("%d attempts; want 1", got)
	}
	wantExecutions(t, e, 0)
}

// MarkFirst and ExpiryHeader: idempotent-replayed: false on the first
// answer; the key's expiry on both.
func testMarkFirstExpiry(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{server: func(o *idemgrpc.ServerOptions) {
		o.Guard.MarkFirst, o.Guard.ExpiryHeader, o.Guard.TTL = true, true, time.Hour
	}})
	ctx := t.Context()
	before := time.Now()
	a1 := e.charge(ctx, e.plain, "k-first", charge(4))
	a2 := e.charge(ctx, e.plain, "k-first", charge(4))
	if a1.err != nil || a2.err != nil {
		t.Fatal(a1.err, a2.err)
	}
	if got := a1.header[idemgrpc.ReplayedMetadata]; len(got) != 1 || got[0] != "false" {
		t.Errorf("first answer: %s %q; want [false]", idemgrpc.ReplayedMetadata, got)
	}
	if !a2.replayed() {
		t.Errorf("second answer: header %v; want replayed", a2.header)
	}
	for i, a := range []answer{a1, a2} {
		exp, err := time.Parse(time.RFC3339, first(a.header[idemgrpc.ExpiresMetadata]))
		// RFC 3339 here has whole seconds: allow one either side.
		if err != nil || exp.Before(before.Add(time.Hour-time.Second)) || exp.After(time.Now().Add(time.Hour+time.Second)) {
			t.Errorf("answer %d: %s %q (%v); want about an hour from now", i+1, idemgrpc.ExpiresMetadata, a.header[idemgrpc.ExpiresMetadata], err)
		}
	}
}

const stormSize = 200

// A 200-call same-key storm runs the handler once; every other call gets
// ABORTED or the replay.
func testStorm(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{})
	answers := storm(t, e)
	var replies []*paypb.ChargeReply
	for _, a := range answers {
		switch {
		case a.err == nil:
			replies = append(replies, a.reply)
		case status.Code(a.err) != codes.Aborted:
			t.Errorf("a storm call: %v; want a reply or Aborted", a.err)
		}
	}
	if len(replies) == 0 {
		t.Fatal("no storm call got the reply")
	}
	for _, r := range replies {
		if !proto.Equal(r, replies[0]) {
			t.Errorf("storm replies %v and %v differ", r, replies[0])
		}
	}
	wantExecutions(t, e, 1)
}

// With a bounded wait, every call of the storm gets the one reply.
func testStormWait(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{
		server: func(o *idemgrpc.ServerOptions) { o.Guard.Wait = 20 * time.Second },
		charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
			time.Sleep(50 * time.Millisecond) // so that the storm finds it in flight
			return okReply(n, req), nil
		},
	})
	answers := storm(t, e)
	for _, a := range answers {
		if a.err != nil || !proto.Equal(a.reply, answers[0].reply) {
			t.Fatalf("a storm call: %v, %v; want the one reply %v", a.reply, a.err, answers[0].reply)
		}
	}
	wantExecutions(t, e, 1)
}

func storm(t *testing.T, e *env) []answer {
	ctx := t.Context()
	answers := make([]answer, stormSize)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range answers {
		wg.Go(func() {
			<-gate
			answers[i] = e.charge(ctx, e.plain, "k-storm", charge(500))
		})
	}
	close(gate)
	wg.Wait()
	return answers
}

// fastClient retries quickly: tests wait for RetryInfo delays, not for
// backoff.
var fastClient = idemgrpc.ClientOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}

// faultOnce returns a server interceptor that answers UNAVAILABLE to the
// first n calls: after the guard and the handler ran (the answer was lost
// on its way back) when after is set, else before.
func faultOnce(n int64, after bool) grpc.UnaryServerInterceptor {
	var calls int64
	var mu sync.Mutex
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		mu.Lock()
		calls++
		fault := calls <= n
		mu.Unlock()
		if !fault {
			return handler(ctx, req)
		}
		if after {
			_, _ = handler(ctx, req)
		}
		return nil, status.Error(codes.Unavailable, "injected: connection reset")
	}
}

// The answer is lost after the charge ran: the client retries with the
// same key and gets the replay, and the charge ran once.
func testClientLostAnswer(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{client: &fastClient, fault: faultOnce(1, true)})
	var replayed bool
	var key string
	reply, err := e.client.Charge(t.Context(), charge(42), idemgrpc.Replayed(&replayed), idemgrpc.SentKey(&key))
	if err != nil {
		t.Fatal(err)
	}
	if !replayed || reply.GetExecution() != 1 {
		t.Errorf("reply %v, replayed %v; want the first run's, replayed", reply, replayed)
	}
	wantExecutions(t, e, 1)
	if keys := e.keys(); len(keys) != 2 || keys[0] != key || keys[1] != key || key == "" {
		t.Errorf("keys sent %q, SentKey %q; want the same key twice", keys, key)
	}
}

// UNAVAILABLE before anything ran: retried with the same key; the first
// run answers, not a replay.
func testClientUnavailable(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{client: &fastClient, fault: faultOnce(2, false)})
	var replayed bool
	reply, err := e.client.Charge(t.Context(), charge(42), idemgrpc.Replayed(&replayed))
	if err != nil {
		t.Fatal(err)
	}
	if replayed || reply.GetExecution() != 1 {
		t.Errorf("reply %v, replayed %v; want the first run, not replayed", reply, replayed)
	}
	if got := e.attempts.Load(); got != 3 {
		t.Errorf("%d attempts reached the server; want 3", got)
	}
	if keys := e.keys(); len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Errorf("keys sent %q; want one key three times", keys)
	}
}

// ABORTED (in flight) is retried after its RetryInfo until the first
// call's answer can be replayed.
func testClientInProgress(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	started, release := make(chan struct{}), make(chan struct{})
	patient := fastClient
	patient.MaxAttempts = 60 // a retry a second: the first call has a minute to finish on a loaded machine
	patient.MaxElapsed = time.Minute
	e := start(t, newStore, setup{client: &patient, charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
		if n == 1 {
			close(started)
			<-release
		}
		return okReply(n, req), nil
	}})
	ctx := t.Context()
	done := make(chan answer, 1)
	go func() { done <- e.charge(ctx, e.plain, "k-client-flight", charge(6)) }()
	<-started
	type result struct {
		reply    *paypb.ChargeReply
		err      error
		replayed bool
	}
	retried := make(chan result, 1)
	go func() {
		var r result
		r.reply, r.err = e.client.Charge(idemgrpc.WithKey(ctx, "k-client-flight"), charge(6), idemgrpc.Replayed(&r.replayed))
		retried <- r
	}()
	waitFor(t, "the client's call to be refused as in progress", func() bool { return e.event("in_progress") >= 1 })
	close(release)
	a1 := <-done
	r := <-retried
	if a1.err != nil || r.err != nil {
		t.Fatal(a1.err, r.err)
	}
	if !proto.Equal(r.reply, a1.reply) || !r.replayed {
		t.Errorf("the client's call: %v (replayed %v); want the first call's %v, replayed", r.reply, r.replayed, a1.reply)
	}
	wantExecutions(t, e, 1)
}

// duplicate_submission is never retried: one attempt each.
func testClientDuplicate(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	if _, ok := newStore(t).(idemstore.WindowStore); !ok {
		t.Skip("the store has no repeat-submit window")
	}
	e := start(t, newStore, setup{client: &fastClient, server: func(o *idemgrpc.ServerOptions) { o.Guard.Window = time.Minute }})
	ctx := t.Context()
	if _, err := e.client.Charge(ctx, charge(13)); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.Charge(ctx, charge(13)) // a new intent: a new key, the same charge
	wantRefusal(t, "the same charge again", err, codes.AlreadyExists, "duplicate_submission", 0)
	if got := e.attempts.Load(); got != 2 {
		t.Errorf("%d attempts reached the server; want 2 (none retried)", got)
	}
	if keys := e.keys(); len(keys) != 2 || keys[0] == keys[1] {
		t.Errorf("keys %q; want two different keys, one per call", keys)
	}
	wantExecutions(t, e, 1)
}

// RESOURCE_EXHAUSTED is retried when its reason is a rate limit, never
// when it is duplicate_submission.
func testClientResourceExhausted(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	refusal := func(reason string) error {
		st, _ := status.New(codes.ResourceExhausted, reason).WithDetails(
			&errdetails.ErrorInfo{Reason: reason, Domain: "example.com"},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Millisecond)})
		return st.Err()
	}
	for _, tc := range []struct {
		reason   string
		attempts int64
	}{{"rate_limited", 2}, {"RATE_LIMIT_EXCEEDED", 2}, {"duplicate_submission", 1}, {"quota_exceeded", 1}} {
		t.Run(tc.reason, func(t *testing.T) {
			e := start(t, newStore, setup{client: &fastClient, charge: func(_ context.Context, n int64, req *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
				if n == 1 {
					return nil, refusal(tc.reason)
				}
				return okReply(n, req), nil
			}})
			_, err := e.client.Charge(t.Context(), charge(21))
			if got := e.attempts.Load(); got != tc.attempts {
				t.Errorf("%d attempts; want %d", got, tc.attempts)
			}
			if (tc.attempts == 2) != (err == nil) {
				t.Errorf("error %v", err)
			}
		})
	}
}

// When the attempts run out, the error says the outcome is unknown and
// carries the key, and every attempt sent it.
func testClientExhausted(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	opts := fastClient
	opts.MaxAttempts = 3
	e := start(t, newStore, setup{client: &opts, fault: faultOnce(3, true)}) // every attempt's answer is lost
	_, err := e.client.Charge(t.Context(), charge(9))
	var ierr *idemgrpc.Error
	if !errors.As(err, &ierr) || !errors.Is(err, idemgrpc.ErrOutcomeUnknown) || status.Code(err) != codes.Unavailable {
		t.Fatalf("error %v; want an *idemgrpc.Error, ErrOutcomeUnknown, Unavailable", err)
	}
	keys := e.keys()
	if ierr.Attempts != 3 || len(keys) != 3 || keys[0] != ierr.Key || keys[1] != ierr.Key || keys[2] != ierr.Key {
		t.Errorf("Attempts %d, Key %q; keys sent %q; want 3 attempts with its key", ierr.Attempts, ierr.Key, keys)
	}
	wantExecutions(t, e, 1) // later attempts replayed the first run's answer, lost each time
	// The caller retries the intent later with the same key: the replay.
	a := e.charge(t.Context(), e.plain, ierr.Key, charge(9))
	if a.err != nil || a.reply.GetExecution() != 1 || !a.replayed() {
		t.Errorf("a later call with the key: %v, %v; want the first run's reply, replayed", a.reply, a.err)
	}
}

// No attempt starts whose wait would pass the call's deadline: a
// RetryInfo of a minute ends a call with 10s left at once, with the key,
// though MaxElapsed (an hour) and attempts are left.
func testClientDeadline(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	opts := fastClient
	opts.MaxElapsed = time.Hour
	e := start(t, newStore, setup{client: &opts, charge: func(context.Context, int64, *paypb.ChargeRequest) (*paypb.ChargeReply, error) {
		st, _ := status.New(codes.Aborted, "come back in a minute").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Minute)})
		return nil, st.Err()
	}})
	ctx, cancel := context.WithTimeout(idemgrpc.WithKey(t.Context(), "k-deadline"), 10*time.Second)
	defer cancel()
	_, err := e.client.Charge(ctx, charge(6))
	var ierr *idemgrpc.Error
	if !errors.As(err, &ierr) || ierr.Attempts != 1 || ierr.Key != "k-deadline" || status.Code(err) != codes.Aborted {
		t.Errorf("error %v; want an *idemgrpc.Error after 1 attempt, Aborted, with the key", err)
	}
	if ctx.Err() != nil {
		t.Errorf("the call waited for its deadline: %v", ctx.Err())
	}
}

// One key per call, the caller's when it set one; methods not listed get
// none.
func testClientKeys(t *testing.T, newStore func(*testing.T) idemstore.Store) {
	e := start(t, newStore, setup{client: &fastClient})
	ctx := t.Context()
	var k1, k2, k3 string
	r1, err1 := e.client.Charge(ctx, charge(1), idemgrpc.SentKey(&k1))
	r2, err2 := e.client.Charge(ctx, charge(1), idemgrpc.SentKey(&k2))
	r3, err3 := e.client.Charge(idemgrpc.WithKey(ctx, "mine"), charge(1), idemgrpc.SentKey(&k3))
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	if k1 == "" || k1 == k2 || k3 != "mine" || r1.GetExecution() == r2.GetExecution() || r3.GetExecution() != 3 {
		t.Errorf("keys %q %q %q, executions %d %d %d; want two random keys and mine, three runs", k1, k2, k3,
			r1.GetExecution(), r2.GetExecution(), r3.GetExecution())
	}
	if keys := e.keys(); len(keys) != 3 || keys[0] != k1 || keys[1] != k2 || keys[2] != "mine" {
		t.Errorf("the server saw keys %q", keys)
	}

	opts := fastClient
	opts.Methods = []string{paypb.Pay_Get_FullMethodName}
	listed := start(t, newStore, setup{client: &opts})
	_, err := listed.client.Charge(ctx, charge(1))
	wantRefusal(t, "Charge, not listed by the client", err, codes.InvalidArgument, "idempotency_key_missing", 0)
	var key string
	if _, err := listed.client.Charge(idemgrpc.WithKey(ctx, "explicit"), charge(1), idemgrpc.SentKey(&key)); err != nil || key != "explicit" {
		t.Errorf("not listed, WithKey: %v, key %q; want the call sent with it", err, key)
	}
}
