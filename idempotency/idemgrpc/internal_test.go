package idemgrpc

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgrpc/internal/paypb"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// Cutting request_id out of a deterministic encoding gives the encoding of
// the message without it, whatever else the message holds, unknown
// fields included.
func TestStripField(t *testing.T) {
	for i := range 50 {
		m := &paypb.ChargeRequest{Amount: int64(i * 1000003), Currency: fmt.Sprint("C", i), RequestId: fmt.Sprint("req-", i)}
		if i%2 == 0 {
			m.Labels = map[string]string{}
			for j := range i {
				m.Labels[fmt.Sprint("k", j)] = fmt.Sprint("v", j)
			}
		}
		if i%3 == 0 { // an unknown field, as from a newer client
			m.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "future"))
		}
		full, err := deterministic.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		without := proto.Clone(m).(*paypb.ChargeRequest)
		without.RequestId = ""
		want, _ := deterministic.Marshal(without)
		if got := stripField(full, 3); !bytes.Equal(got, want) {
			t.Fatalf("message %d: stripped %x; want %x", i, got, want)
		}
	}
	bad := []byte{0x0a, 0x05, 'a'} // a length running past the end
	if got := stripField(bytes.Clone(bad), 3); !bytes.Equal(got, bad) {
		t.Errorf("an unreadable encoding: %x; want it whole", got)
	}
}

// The problems' codes, RetryInfo and ErrorInfo: the package
// documentation's table.
func TestProblemStatus(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		p     idempotency.Problem
		ctx   context.Context
		code  codes.Code
		retry time.Duration
	}{
		{idempotency.Problem{Status: 409, Code: "request_in_progress", RetryAfter: 1}, nil, codes.Aborted, time.Second},
		{idempotency.Problem{Status: 422, Code: "idempotency_key_reused"}, nil, codes.FailedPrecondition, 0},
		{idempotency.Problem{Status: 400, Code: "idempotency_key_missing"}, nil, codes.InvalidArgument, 0},
		{idempotency.Problem{Status: 400, Code: "idempotency_key_invalid"}, nil, codes.InvalidArgument, 0},
		{idempotency.Problem{Status: 400, Code: "submit_token_required"}, nil, codes.InvalidArgument, 0},
		{idempotency.Problem{Status: 400, Code: "submit_token_invalid"}, nil, codes.FailedPrecondition, 0},
		{idempotency.Problem{Status: 429, Code: "duplicate_submission", RetryAfter: 30}, nil, codes.AlreadyExists, 0},
		{idempotency.Problem{Status: 503, Code: "store_unavailable", RetryAfter: 2}, nil, codes.Unavailable, 2 * time.Second},
		{idempotency.Problem{Status: 503, Code: "request_interrupted", RetryAfter: 1}, nil, codes.Unavailable, time.Second},
		{idempotency.Problem{Status: 503, Code: "request_interrupted", RetryAfter: 1}, canceled, codes.Canceled, 0},
		{idempotency.Problem{Status: 401, Code: "unauthenticated"}, nil, codes.Unauthenticated, 0},
		{idempotency.Problem{Status: 413, Code: "body_too_large"}, nil, codes.ResourceExhausted, 0},
		{idempotency.Problem{Status: 400, Code: "invalid_json"}, nil, codes.InvalidArgument, 0},
		// A hook's own problems, by status.
		{idempotency.Problem{Status: 403, Code: "forbidden"}, nil, codes.PermissionDenied, 0},
		{idempotency.Problem{Status: 404, Code: "no_account"}, nil, codes.NotFound, 0},
		{idempotency.Problem{Status: 429, Code: "rate_limited", RetryAfter: 3}, nil, codes.ResourceExhausted, 3 * time.Second},
		{idempotency.Problem{Status: 503, Code: "sessions_down", RetryAfter: 5}, nil, codes.Unavailable, 5 * time.Second},
		{idempotency.Problem{Status: 504, Code: "slow"}, nil, codes.DeadlineExceeded, 0},
		{idempotency.Problem{Status: 418, Code: "teapot"}, nil, codes.FailedPrecondition, 0},
		{idempotency.Problem{Status: 500, Code: "bug"}, nil, codes.Internal, 0},
	} {
		ctx := tc.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		st := ProblemStatus(ctx, &tc.p)
		if st.Code() != tc.code {
			t.Errorf("%s: code %v; want %v", tc.p.Code, st.Code(), tc.code)
		}
		var info *errdetails.ErrorInfo
		var retry *errdetails.RetryInfo
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				info = d
			case *errdetails.RetryInfo:
				retry = d
			}
		}
		if info.GetReason() != tc.p.Code || info.GetDomain() != Domain {
			t.Errorf("%s: ErrorInfo %v", tc.p.Code, info)
		}
		if got := retry.GetRetryDelay().AsDuration(); (retry == nil) != (tc.retry == 0) || got != tc.retry {
			t.Errorf("%s: RetryInfo %v; want %v", tc.p.Code, retry, tc.retry)
		}
		if ok, _ := Retryable(st.Err()); ok != (tc.code == codes.Aborted || tc.code == codes.Unavailable || tc.p.Code == "rate_limited") {
			t.Errorf("%s: Retryable %v", tc.p.Code, ok)
		}
	}
}

// What the client retries, and the delay it waits at least.
func TestRetryable(t *testing.T) {
	with := func(c codes.Code, reason string, delay time.Duration) error {
		st := status.New(c, "x")
		var ds []protoadapt.MessageV1
		if reason != "" {
			ds = append(ds, &errdetails.ErrorInfo{Reason: reason, Domain: "example.com"})
		}
		if delay >= 0 {
			ds = append(ds, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
		}
		for _, d := range ds {
			st, _ = st.WithDetails(d)
		}
		return st.Err()
	}
	for _, tc := range []struct {
		err   error
		retry bool
		delay time.Duration
	}{
		{status.Error(codes.Unavailable, "connection refused"), true, 0},
		{with(codes.Unavailable, "store_unavailable", 2*time.Second), true, 2 * time.Second},
		{with(codes.Aborted, "request_in_progress", time.Second), true, time.Second},
		{with(codes.Aborted, "request_in_progress", -1), true, 0},
		{with(codes.Aborted, "", 300*time.Millisecond), true, 300 * time.Millisecond},
		{status.Error(codes.Aborted, "a transaction conflict"), false, 0},
		{with(codes.ResourceExhausted, "rate_limited", time.Second), true, time.Second},
		{with(codes.ResourceExhausted, "RATE_LIMIT_EXCEEDED", -1), true, 0},
		{with(codes.ResourceExhausted, "duplicate_submission", time.Second), false, 0},
		{with(codes.Unavailable, "duplicate_submission", time.Second), false, 0},
		{with(codes.ResourceExhausted, "", time.Second), false, 0}, // a message over the limit, a quota
		{with(codes.AlreadyExists, "duplicate_submission", -1), false, 0},
		{status.Error(codes.Internal, "bug"), false, 0},
		{status.Error(codes.DeadlineExceeded, "late"), false, 0},
		{fmt.Errorf("not a status"), false, 0},
	} {
		retry, delay := Retryable(tc.err)
		if retry != tc.retry || delay != tc.delay {
			t.Errorf("Retryable(%v) = %v, %v; want %v, %v", tc.err, retry, delay, tc.retry, tc.delay)
		}
	}
}

// The codes of a handler's errors: stored (below 500), transient (freed
// however stored) or freed (5xx).
func TestCodeStatus(t *testing.T) {
	for c := codes.OK + 1; c <= codes.Unauthenticated; c++ {
		st, transient := codeStatus(c)
		switch c {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.NotFound, codes.AlreadyExists,
			codes.PermissionDenied, codes.Unauthenticated:
			if st >= 500 || transient {
				t.Errorf("%v: %d, transient %v; want stored", c, st, transient)
			}
		case codes.Aborted, codes.ResourceExhausted:
			if !transient {
				t.Errorf("%v: not transient", c)
			}
		default:
			if st < http.StatusInternalServerError {
				t.Errorf("%v: %d; want a 5xx (freed)", c, st)
			}
		}
	}
}

// The Guard's options for HTTP answers are refused, each with its own
// message: gRPC has no body field for a key and no form to offer a token.
func TestHTTPOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*idempotency.Options[*UnaryRequest])
		want string
	}{
		{"KeyField", func(o *idempotency.Options[*UnaryRequest]) { o.KeyField = "key" }, "idemgrpc: Options.KeyField is for HTTP bodies; use ServerOptions.RequestIDField"},
		{"OfferToken", func(o *idempotency.Options[*UnaryRequest]) { o.OfferToken = true }, "idemgrpc: Options.OfferToken is for HTTP answers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o ServerOptions
			o.Guard.Store = &memstore.Store{}
			c.set(&o.Guard)
			defer func() {
				if got := recover(); got != c.want {
					t.Errorf("panic %v; want %q", got, c.want)
				}
			}()
			UnaryServerInterceptor(o)
		})
	}
}
