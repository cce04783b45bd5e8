// Package idemgrpc is the gRPC adapter of the idempotency Guard: a unary
// server interceptor that runs each keyed call at most once and answers
// its retries with the first answer, and a unary client interceptor that
// gives each call one key and retries it only where that is safe.
//
// # Server
//
// UnaryServerInterceptor runs the checks of idempotency.Guard (the same
// code as the net/http Middleware, in the same order) on each guarded
// unary call:
//
//   - the key is the idempotency-key metadata; without it, following
//     Google AIP-155, a request_id string field of the request message,
//     when it has one and it is set (ServerOptions.RequestIDField);
//   - the key is scoped to the principal (Options.Principal), the method
//     Method ("GRPC") and the call's full method name;
//   - the fingerprint is a SHA-256 of the request message's deterministic
//     proto encoding (proto.MarshalOptions{Deterministic: true}), without
//     the request_id field when that field is the key;
//   - the stored answer is the reply message's encoding, replayed as a
//     message of the same type, or the error's status (code, message,
//     details), replayed as the same status; a replay carries the header
//     metadata idempotent-replayed: true (and the trailer too, when it is
//     an error).
//
// The Guard's problems become statuses with an ErrorInfo detail whose
// reason is the problem's code and whose domain is Domain ("onceguard"),
// and, where the client should come back, a RetryInfo:
//
//	request_in_progress        ABORTED              RetryInfo (1s)
//	idempotency_key_reused     FAILED_PRECONDITION
//	idempotency_key_missing    INVALID_ARGUMENT
//	idempotency_key_invalid    INVALID_ARGUMENT
//	submit_token_required      INVALID_ARGUMENT     (the key's form is wrong, whatever the state)
//	submit_token_invalid       FAILED_PRECONDITION  (the token is unknown, used or expired: state)
//	duplicate_submission       ALREADY_EXISTS       no RetryInfo (see below)
//	store_unavailable          UNAVAILABLE          RetryInfo (2s)
//	request_interrupted        CANCELED or DEADLINE_EXCEEDED (the call's context), else UNAVAILABLE
//	unauthenticated            UNAUTHENTICATED
//	body_too_large             RESOURCE_EXHAUSTED   (as gRPC answers a message over its limit)
//	invalid_json               INVALID_ARGUMENT     (a Fingerprint hook's refusal)
//	any other code             by its HTTP status (400 INVALID_ARGUMENT, 401 UNAUTHENTICATED,
//	                           403 PERMISSION_DENIED, 404 NOT_FOUND, 409 ABORTED, 412 and 422
//	                           FAILED_PRECONDITION, 413 and 429 RESOURCE_EXHAUSTED, 501
//	                           UNIMPLEMENTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, other
//	                           4xx FAILED_PRECONDITION, 5xx INTERNAL)
//
// duplicate_submission is a business refusal: the same request was
// accepted moments ago under another key. It is ALREADY_EXISTS, not
// RESOURCE_EXHAUSTED, because retry policies (gRPC's service config, most
// client libraries) retry RESOURCE_EXHAUSTED with the same metadata, and a
// retry under the second key after the window would move the money a
// second time. The seconds left of the window are in the ErrorInfo's
// metadata (retry_after_seconds), for a user to be told, not for a
// retry.
//
// A handler's error is stored or frees the key by its code, as a 4xx and
// a 5xx are under the net/http Middleware:
//
//	stored, replayed as it is    INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE,
//	                             NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED
//	sent, key freed (transient)  ABORTED, RESOURCE_EXHAUSTED: answers that ask the client
//	                             to come back, which a replay would repeat for the key's TTL
//	key freed, unless            CANCELED, UNKNOWN (also a plain error), DEADLINE_EXCEEDED,
//	Options.StoreServerErrors    INTERNAL, UNAVAILABLE, UNIMPLEMENTED, DATA_LOSS
//
// A panic frees the key and is re-raised (put a recovery interceptor
// outside this one). The handler's context carries the *idempotency.Call
// (idempotency.FromContext): Call.Forget frees the key of any answer, and
// Call.MarkCompleted, after idempotency.CompleteTx in the handler's own
// transaction, stores a Response whose Header is
// {"Content-Type": {ReplyContentType(reply)}} and whose Body is the
// reply's encoding, status 200.
//
// Only unary calls are guarded; streams pass through untouched.
//
// # Client
//
// UnaryClientInterceptor sends each call of a guarded method with one
// idempotency-key (the caller's, from WithKey or its outgoing metadata, or
// a fresh random one) and retries it with the same key and the same
// request on UNAVAILABLE, on ABORTED with a RetryInfo or the reason
// request_in_progress, and on RESOURCE_EXHAUSTED whose ErrorInfo reason
// is a rate limit (rate_limited, RATE_LIMIT_EXCEEDED); never on
// duplicate_submission. See ClientOptions.
package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// The metadata keys, the scope's method and the ErrorInfo domain.
const (
	// KeyMetadata carries the idempotency key of a call.
	KeyMetadata = "idempotency-key"
	// ReplayedMetadata is "true" in the header (and, for an error, the
	// trailer) of a replayed answer; "false" on first answers with
	// Options.MarkFirst.
	ReplayedMetadata = "idempotent-replayed"
	// ExpiresMetadata is, with Options.ExpiryHeader, when the key's record
	// expires (RFC 3339, UTC): until then a retry gets this answer.
	ExpiresMetadata = "idempotency-key-expires"
	// Method is the Request.Method of every call: a key is scoped to the
	// principal, Method and the full method name.
	Method = "GRPC"
	// Domain is the domain of the ErrorInfo details of the Guard's
	// refusals.
	Domain = "onceguard"
	// DefaultRequestIDField is the request message field read as the key
	// when a call has no idempotency-key metadata (AIP-155).
	DefaultRequestIDField = "request_id"
	// DefaultMaxMessage is the default Options.MaxBody: gRPC's default
	// limit on a received message, 4 MiB.
	DefaultMaxMessage = 4 << 20
)

// UnaryRequest is a unary call as the Guard's hooks (Principal,
// Fingerprint, OnEvent) see it.
type UnaryRequest struct {
	Ctx  context.Context       // the call's context: its metadata, peer, auth info
	Info *grpc.UnaryServerInfo // the method called
	Req  proto.Message         // the request message
}

// ServerOptions configure UnaryServerInterceptor.
type ServerOptions struct {
	// Guard is the Guard's options. Store is required. Its hooks get the
	// *UnaryRequest; Fingerprint gets the request's deterministic
	// encoding (without the request_id field when it is the key) and
	// defaults to its SHA-256. MaxBody bounds that encoding (default
	// DefaultMaxMessage: raise it with grpc.MaxRecvMsgSize). KeyField
	// must be empty (RequestIDField is its gRPC form: the constructor
	// panics otherwise) and ReplayHeaders is ignored: an answer is a
	// message or a status.
	Guard idempotency.Options[*UnaryRequest]
	// Methods lists the full method names guarded
	// ("/pkg.Service/Method"); other calls pass through untouched.
	// Default: nil, every unary method: a call without a key is refused
	// (INVALID_ARGUMENT) unless Guard.KeyOptional.
	Methods []string
	// RequestIDField names the string field of a request message that
	// carries the key when the call has no idempotency-key metadata
	// (AIP-155); "-" reads none. Default: DefaultRequestIDField.
	RequestIDField string
}

type server struct {
	g       *idempotency.Guard[*UnaryRequest]
	o       *idempotency.Options[*UnaryRequest]
	methods map[string]bool // nil: all
	field   protoreflect.Name
}

// UnaryServerInterceptor returns the interceptor of o. It panics where
// idempotency.NewGuard does, and when o.Guard.KeyField or
// o.Guard.OfferToken (the next submit token of an HTTP form) is set.
func UnaryServerInterceptor(o ServerOptions) grpc.UnaryServerInterceptor {
	s := newServer(o)
	return s.intercept
}

func newServer(o ServerOptions) *server {
	g := o.Guard
	if g.KeyField != "" {
		panic("idemgrpc: Options.KeyField is for HTTP bodies; use ServerOptions.RequestIDField")
	}
	if g.OfferToken {
		panic("idemgrpc: Options.OfferToken is for HTTP answers")
	}
	if g.Deferred {
		panic("idemgrpc: Options.Deferred is supported by idempotency.Middleware only")
	}
	g.ReplayHeaders = []string{"Content-Type"}
	if g.MaxBody <= 0 {
		g.MaxBody = DefaultMaxMessage
	}
	if g.Fingerprint == nil {
		g.Fingerprint = hashFingerprint
	}
	s := &server{g: idempotency.NewGuard(g), o: &g}
	switch o.RequestIDField {
	case "":
		s.field = DefaultRequestIDField
	case "-":
	default:
		s.field = protoreflect.Name(o.RequestIDField)
	}
	if o.Methods != nil {
		s.methods = make(map[string]bool, len(o.Methods))
		for _, m := range o.Methods {
			s.methods[m] = true
		}
	}
	return s
}

// hashFingerprint is the default fingerprint: the hex SHA-256 of the
// request's deterministic encoding.
func hashFingerprint(_ *UnaryRequest, body []byte) (string, error) {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:]), nil
}

var deterministic = proto.MarshalOptions{Deterministic: true}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.methods != nil && !s.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		// Fail closed: without its encoding there is no fingerprint.
		return nil, status.Errorf(codes.Internal, "idemgrpc: the request of %s is not a proto.Message", info.FullMethod)
	}
	keys := metadata.ValueFromIncomingContext(ctx, KeyMetadata)
	var idField protoreflect.FieldNumber
	if len(keys) == 0 && s.field != "" {
		if k, num := s.requestID(msg); num != 0 {
			keys, idField = []string{k}, num
		}
	}
	body, err := deterministic.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "idemgrpc: the request cannot be encoded: %v", err)
	}
	if idField != 0 {
		body = stripField(body, idField)
	}
	r := &UnaryRequest{Ctx: ctx, Info: info, Req: msg}
	out := s.g.Begin(ctx, r, &idempotency.Request{Method: Method, Path: info.FullMethod, Key: keys, Body: body})
	switch {
	case out.Problem != nil:
		return nil, problemStatus(ctx, out.Problem).Err()
	case out.Replay != nil:
		return replay(ctx, out.Replay, out.Expires)
	case out.Call == nil: // no key, and none needed
		return handler(ctx, req)
	}
	call := out.Call
	resp, herr := s.run(r, call, req, handler)
	a, final := answer(call, resp, herr)
	if p := s.g.Finish(r, call, a); p != nil {
		return nil, problemStatus(ctx, p).Err()
	}
	if md := s.firstMetadata(out.Expires); md != nil {
		_ = grpc.SetHeader(ctx, md)
	}
	if final != nil {
		return nil, final
	}
	return resp, nil
}

// run runs the handler in the Call's context; a panic frees the key, then
// is re-raised.
func (s *server) run(r *UnaryRequest, call *idempotency.Call, req any, handler grpc.UnaryHandler) (any, error) {
	defer func() {
		if v := recover(); v != nil {
			s.g.Abort(r, call)
			panic(v)
		}
	}()
	return handler(call.Context(), req)
}

// requestID returns the AIP-155 request_id of m and its field number, or
// 0 when m has no such string field or it is empty.
func (s *server) requestID(m proto.Message) (string, protoreflect.FieldNumber) {
	pm := m.ProtoReflect()
	fd := pm.Descriptor().Fields().ByName(s.field)
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() || !pm.Has(fd) {
		return "", 0
	}
	v := pm.Get(fd).String()
	if v == "" {
		return "", 0
	}
	return v, fd.Number()
}

// stripField cuts the top-level field num out of the encoding b, in
// place: what a deterministic encoding of the message without that field
// is (fields are written in number order, unknown fields last).
func stripField(b []byte, num protowire.Number) []byte {
	out, rest := b[:0], b
	for len(rest) > 0 {
		n, typ, tl := protowire.ConsumeTag(rest)
		if tl < 0 {
			return b // not an encoding we can read: keep it whole
		}
		vl := protowire.ConsumeFieldValue(n, typ, rest[tl:])
		if vl < 0 {
			return b
		}
		if n != num {
			out = append(out, rest[:tl+vl]...) // copy never runs ahead of rest
		}
		rest = rest[tl+vl:]
	}
	return out
}

// The stored Content-Type of an answer names its message type.
const statusType = "google.rpc.Status"

// ReplyContentType returns the Content-Type under which the interceptor
// stores reply: what a handler that completes the record itself
// (idempotency.CompleteTx) stores as its Response's header, with the
// reply's deterministic encoding as Body and status 200.
func ReplyContentType(reply proto.Message) string {
	return contentType(reply.ProtoReflect().Descriptor().FullName())
}

// contentTypePrefix starts a stored answer's Content-Type; the message's
// full name, a token ([A-Za-z0-9_.]), follows as the messagetype
// parameter.
const contentTypePrefix = "application/x-protobuf; messagetype="

func contentType(name protoreflect.FullName) string { return contentTypePrefix + string(name) }

// messageType returns the message type named by a stored Content-Type.
func messageType(ct string) protoreflect.FullName {
	if name, ok := strings.CutPrefix(ct, contentTypePrefix); ok {
		return protoreflect.FullName(name)
	}
	_, params, _ := mime.ParseMediaType(ct) // not written by this package: read it as a media type
	return protoreflect.FullName(params["messagetype"])
}

// answer returns the Answer that stores the handler's reply or error, and
// the error to send (nil: send resp). A transient refusal is Forgotten.
func answer(call *idempotency.Call, resp any, err error) (a idempotency.Answer, final error) {
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err) // as grpc-go itself converts a handler's error
		}
		httpStatus, transient := codeStatus(st.Code())
		if transient {
			call.Forget()
		}
		body, merr := proto.Marshal(st.Proto())
		if merr != nil {
			return idempotency.Answer{Status: http.StatusInternalServerError, Written: true}, st.Err()
		}
		return idempotency.Answer{Status: httpStatus, Header: http.Header{"Content-Type": {contentType(statusType)}}, Body: body, Written: true}, st.Err()
	}
	m, ok := resp.(proto.Message)
	if !ok || m == nil || !m.ProtoReflect().IsValid() {
		// grpc-go could not send it either: nothing to store.
		return idempotency.Answer{Status: http.StatusInternalServerError, Written: true},
			status.Error(codes.Internal, "idemgrpc: the handler returned no reply message")
	}
	body, merr := deterministic.Marshal(m)
	if merr != nil {
		return idempotency.Answer{Status: http.StatusInternalServerError, Written: true},
			status.Errorf(codes.Internal, "idemgrpc: the reply cannot be encoded: %v", merr)
	}
	return idempotency.Answer{Status: http.StatusOK, Header: http.Header{"Content-Type": {ReplyContentType(m)}}, Body: body, Written: true}, nil
}

// codeStatus returns the HTTP status a handler's error code is stored
// under (a 5xx frees the key), and whether it is a transient refusal
// whose key is freed however it is stored.
func codeStatus(c codes.Code) (httpStatus int, transient bool) {
	switch c {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest, false
	case codes.Unauthenticated:
		return http.StatusUnauthorized, false
	case codes.PermissionDenied:
		return http.StatusForbidden, false
	case codes.NotFound:
		return http.StatusNotFound, false
	case codes.AlreadyExists:
		return http.StatusConflict, false
	case codes.Aborted:
		return http.StatusConflict, true
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests, true
	case codes.Unimplemented:
		return http.StatusNotImplemented, false
	case codes.Unavailable, codes.Canceled:
		return http.StatusServiceUnavailable, false
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout, false
	default: // Unknown, Internal, DataLoss, and any code grpc does not define
		return http.StatusInternalServerError, false
	}
}

// replay answers the stored answer resp: the reply message of its stored
// type, or its stored status.
func replay(ctx context.Context, resp *idemstore.Response, expires time.Time) (any, error) {
	md := metadata.MD{ReplayedMetadata: {"true"}}
	if !expires.IsZero() {
		md[ExpiresMetadata] = []string{expires.UTC().Format(time.RFC3339)}
	}
	_ = grpc.SetHeader(ctx, md)
	name := messageType(resp.Header.Get("Content-Type"))
	if resp.Status == http.StatusOK {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
		if err != nil {
			return nil, unreadable(name, err)
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal(resp.Body, m); err != nil {
			return nil, unreadable(name, err)
		}
		return m, nil
	}
	var sp spb.Status
	if err := proto.Unmarshal(resp.Body, &sp); err != nil || name != statusType || sp.Code == 0 {
		return nil, unreadable(name, err)
	}
	_ = grpc.SetTrailer(ctx, md) // an error's header may reach the client as its trailer
	return nil, status.ErrorProto(&sp)
}

// unreadable is the answer to a stored answer that cannot be replayed (a
// message type not linked into this binary): the call ran, so it is not
// run again.
func unreadable(name protoreflect.FullName, err error) error {
	st := status.Newf(codes.Internal, "idemgrpc: the stored answer (%q) cannot be replayed: %v", name, err)
	st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: "replay_unreadable", Domain: Domain})
	return st.Err()
}

// firstMetadata returns the header a first answer gets (Options.MarkFirst,
// Options.ExpiryHeader), or nil.
func (s *server) firstMetadata(expires time.Time) metadata.MD {
	if !s.o.MarkFirst && expires.IsZero() {
		return nil
	}
	md := metadata.MD{}
	if s.o.MarkFirst {
		md[ReplayedMetadata] = []string{"false"}
	}
	if !expires.IsZero() {
		md[ExpiresMetadata] = []string{expires.UTC().Format(time.RFC3339)}
	}
	return md
}

// ProblemStatus returns the status a Guard's problem p is answered with
// (see the package documentation's table): its code, p's detail (or
// title) as the message, an ErrorInfo with p.Code as the reason and, for
// a problem the client should retry, a RetryInfo of p.RetryAfter. ctx is
// the call's: request_interrupted is its error's code.
func ProblemStatus(ctx context.Context, p *idempotency.Problem) *status.Status {
	return problemStatus(ctx, p)
}

func problemStatus(ctx context.Context, p *idempotency.Problem) *status.Status {
	c := problemCode(p)
	if p.Code == "request_interrupted" && ctx.Err() != nil {
		c = status.FromContextError(ctx.Err()).Code()
	}
	msg := p.Detail
	if msg == "" {
		msg = p.Title
	}
	info := &errdetails.ErrorInfo{Reason: p.Code, Domain: Domain}
	if p.RetryAfter > 0 {
		info.Metadata = map[string]string{"retry_after_seconds": strconv.Itoa(p.RetryAfter)}
	}
	st := status.New(c, msg)
	var err error
	if p.RetryAfter > 0 && (c == codes.Aborted || c == codes.Unavailable || (c == codes.ResourceExhausted && p.Code != "duplicate_submission")) {
		st, err = st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(p.RetryAfter) * time.Second)})
	} else {
		st, err = st.WithDetails(info)
	}
	if err != nil { // cannot happen: both details marshal
		return status.New(c, msg)
	}
	return st
}

// problemCode maps a Guard's problem to a gRPC code: by its code, else by
// its HTTP status.
func problemCode(p *idempotency.Problem) codes.Code {
	switch p.Code {
	case "request_in_progress":
		return codes.Aborted
	case "idempotency_key_reused", "submit_token_invalid":
		return codes.FailedPrecondition
	case "idempotency_key_missing", "idempotency_key_invalid", "submit_token_required", "invalid_json":
		return codes.InvalidArgument
	case "duplicate_submission":
		return codes.AlreadyExists
	case "store_unavailable", "request_interrupted":
		return codes.Unavailable
	case "unauthenticated":
		return codes.Unauthenticated
	case "body_too_large":
		return codes.ResourceExhausted
	}
	switch s := p.Status; {
	case s == http.StatusBadRequest:
		return codes.InvalidArgument
	case s == http.StatusUnauthorized:
		return codes.Unauthenticated
	case s == http.StatusForbidden:
		return codes.PermissionDenied
	case s == http.StatusNotFound:
		return codes.NotFound
	case s == http.StatusConflict:
		return codes.Aborted
	case s == http.StatusPreconditionFailed, s == http.StatusUnprocessableEntity:
		return codes.FailedPrecondition
	case s == http.StatusRequestEntityTooLarge, s == http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case s == http.StatusNotImplemented:
		return codes.Unimplemented
	case s == http.StatusServiceUnavailable:
		return codes.Unavailable
	case s == http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case s >= 400 && s < 500:
		return codes.FailedPrecondition
	case s >= 500:
		return codes.Internal
	}
	return codes.Unknown
}
