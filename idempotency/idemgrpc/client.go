package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/onceguard/onceguard/idempotency/idemclient"
)

// Defaults of ClientOptions' zero fields: those of idemclient.Transport.
const (
	DefaultMaxAttempts = idemclient.DefaultMaxAttempts
	DefaultMaxElapsed  = idemclient.DefaultMaxElapsed
	DefaultMinBackoff  = idemclient.DefaultMinBackoff
	DefaultMaxBackoff  = idemclient.DefaultMaxBackoff
)

// ErrOutcomeUnknown is returned, wrapped in an *Error, when a call's
// retries ran out (attempts, MaxElapsed, the call's deadline) without a
// final answer: the server may or may not have run it, and only a call
// with the same key can tell.
var ErrOutcomeUnknown = errors.New("idemgrpc: outcome unknown")

// Error reports a call that got no final answer; Key is the key it was
// sent with, to retry the same intent later (WithKey). Its gRPC status
// (status.FromError, status.Code) is the last attempt's.
type Error struct {
	Key      string
	Attempts int
	Err      error // the last attempt's error
}

func (e *Error) Error() string {
	return fmt.Sprintf("idemgrpc: no final answer after %d attempts with key %s: %v", e.Attempts, e.Key, e.Err)
}

// Unwrap lets errors.Is find ErrOutcomeUnknown and the last attempt's error.
func (e *Error) Unwrap() []error { return []error{ErrOutcomeUnknown, e.Err} }

// GRPCStatus returns the last attempt's status.
func (e *Error) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// ClientOptions configure UnaryClientInterceptor. The zero value guards
// every unary method with the defaults.
type ClientOptions struct {
	// Methods lists the full method names ("/pkg.Service/Method") whose
	// calls get a key and are retried; other calls pass through once,
	// with the key of WithKey if the caller set one. Default: nil, every
	// unary method: only right if the server guards them all, since a
	// retry of an unguarded call after UNAVAILABLE may run it twice.
	Methods []string
	// NewKey mints the key of a call that has none; nil means
	// idemclient.NewKey (128 random bits in hex).
	NewKey func(ctx context.Context, method string) (string, error)
	// MaxAttempts bounds the attempts per call; 0 means DefaultMaxAttempts.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of
	// the last; 0 means DefaultMaxElapsed. The call's deadline bounds it
	// too: no attempt starts whose wait would pass it.
	MaxElapsed time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait
	// between attempts; a RetryInfo's delay is waited at least. 0 means the
	// defaults.
	MinBackoff, MaxBackoff time.Duration
}

type keyCtx struct{}

// WithKey returns ctx with the idempotency key of the call made with it:
// one key per intent (one charge), kept for every retry of that intent,
// including one made after an *Error. A key in the call's outgoing
// metadata (idempotency-key) wins over it.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// callOption is the interceptor's CallOption: it does nothing in grpc
// itself.
type callOption struct {
	grpc.EmptyCallOption
	replayed *bool
	key      *string
}

// Replayed returns a CallOption that sets *p, once the call returns,
// to whether its answer (a reply or an error) was a stored answer
// replayed by the server (idempotent-replayed: true) rather than a first
// execution's.
func Replayed(p *bool) grpc.CallOption { return callOption{replayed: p} }

// SentKey returns a CallOption that sets *p to the key the call was sent
// with ("" if none).
func SentKey(p *string) grpc.CallOption { return callOption{key: p} }

// IsReplayed reports whether the header or trailer metadata of an answer
// marks it as replayed.
func IsReplayed(header, trailer metadata.MD) bool {
	return first(header[ReplayedMetadata]) == "true" || first(trailer[ReplayedMetadata]) == "true"
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

type client struct {
	o       ClientOptions
	methods map[string]bool
	sleep   func(ctx context.Context, d time.Duration) error // tests replace it
}

// UnaryClientInterceptor returns the interceptor of o: see ClientOptions
// and the package documentation.
func UnaryClientInterceptor(o ClientOptions) grpc.UnaryClientInterceptor {
	return newClient(o).intercept
}

func newClient(o ClientOptions) *client {
	c := &client{o: o, sleep: sleep}
	if o.Methods != nil {
		c.methods = make(map[string]bool, len(o.Methods))
		for _, m := range o.Methods {
			c.methods[m] = true
		}
	}
	return c
}

func (c *client) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var replayed *bool
	var sentKey *string
	for _, o := range opts {
		if co, ok := o.(callOption); ok {
			if co.replayed != nil {
				replayed = co.replayed
			}
			if co.key != nil {
				sentKey = co.key
			}
		}
	}
	key := first(metadata.ValueFromOutgoingContext(ctx, KeyMetadata))
	if key == "" {
		key, _ = ctx.Value(keyCtx{}).(string)
		if key == "" && (c.methods == nil || c.methods[method]) {
			var err error
			if key, err = c.newKey(ctx, method); err != nil {
				return status.Errorf(codes.Internal, "idemgrpc: minting a key: %v", err)
			}
		}
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, KeyMetadata, key)
		}
	}
	if sentKey != nil {
		*sentKey = key
	}
	var header, trailer metadata.MD
	if replayed != nil {
		opts = append(opts[:len(opts):len(opts)], grpc.Header(&header), grpc.Trailer(&trailer))
	}
	report := func(err error) error {
		if replayed != nil {
			*replayed = IsReplayed(header, trailer)
		}
		return err
	}
	if (c.methods != nil && !c.methods[method]) || key == "" {
		return report(invoker(ctx, method, req, reply, cc, opts...))
	}

	maxAttempts := or(c.o.MaxAttempts, DefaultMaxAttempts)
	deadline := time.Now().Add(or(c.o.MaxElapsed, DefaultMaxElapsed))
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for attempt := 1; ; attempt++ {
		header, trailer = nil, nil
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil {
			return report(nil)
		}
		if ctx.Err() != nil {
			return report(&Error{Key: key, Attempts: attempt, Err: err})
		}
		retry, after := Retryable(err)
		if !retry {
			return report(err) // the server's final answer
		}
		wait := max(after, c.backoff(attempt))
		if attempt >= maxAttempts || time.Now().Add(wait).After(deadline) {
			return report(&Error{Key: key, Attempts: attempt, Err: err})
		}
		if serr := c.sleep(ctx, wait); serr != nil {
			return report(&Error{Key: key, Attempts: attempt, Err: err})
		}
	}
}

// Retryable reports whether a call that failed with err may be sent again
// with the same key and request, and the delay its RetryInfo asks for (0
// without one): UNAVAILABLE (the call may not have reached the server, or
// its store was down: the same key makes a retry harmless); ABORTED with a
// RetryInfo or the reason request_in_progress (the key's first call is
// still running); RESOURCE_EXHAUSTED whose ErrorInfo reason is a rate
// limit (rate_limited, RATE_LIMIT_EXCEEDED). Never duplicate_submission,
// whatever its code: the same intent was already accepted under another
// key.
func Retryable(err error) (bool, time.Duration) {
	st, ok := status.FromError(err)
	if !ok {
		return false, 0
	}
	var reason string
	var delay time.Duration
	hasRetryInfo := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if reason == "" {
				reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			hasRetryInfo = true
			if rd := d.GetRetryDelay(); rd != nil && rd.IsValid() {
				delay = max(rd.AsDuration(), 0)
			}
		}
	}
	if reason == "duplicate_submission" {
		return false, 0
	}
	switch st.Code() {
	case codes.Unavailable:
		return true, delay
	case codes.Aborted:
		if hasRetryInfo || reason == "request_in_progress" {
			return true, delay
		}
	case codes.ResourceExhausted:
		if reason == "rate_limited" || reason == "RATE_LIMIT_EXCEEDED" {
			return true, delay
		}
	}
	return false, 0
}

// backoff is a full-jitter exponential wait before attempt+1, as
// idemclient's.
func (c *client) backoff(attempt int) time.Duration {
	lo, hi := or(c.o.MinBackoff, DefaultMinBackoff), or(c.o.MaxBackoff, DefaultMaxBackoff)
	hi = max(hi, lo)
	d := lo << min(attempt-1, 20)
	if d <= 0 || d > hi {
		d = hi
	}
	return lo/2 + rand.N(d-lo/2+1)
}

func (c *client) newKey(ctx context.Context, method string) (string, error) {
	if c.o.NewKey != nil {
		return c.o.NewKey(ctx, method)
	}
	return idemclient.NewKey(), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
