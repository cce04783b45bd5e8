package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/idempotency"
)

// answer is how one error code is answered.
type answer struct {
	status     int
	title      string
	retryAfter int // seconds, 0: no Retry-After
}

// codes is the one table from an error code to its answer; docs/api.md lists the same codes.
var codes = map[string]answer{
	app.CodeInvalid:           {http.StatusBadRequest, "Invalid request", 0},
	"invalid_json":            {http.StatusBadRequest, "Invalid JSON", 0},
	app.CodeInvalidUsername:   {http.StatusBadRequest, "Invalid username", 0},
	app.CodeInvalidPassword:   {http.StatusBadRequest, "Invalid password", 0},
	app.CodeInvalidAmount:     {http.StatusBadRequest, "Invalid amount", 0},
	app.CodeInvalidPurpose:    {http.StatusBadRequest, "Invalid purpose", 0},
	app.CodeUnauthenticated:   {http.StatusUnauthorized, "Authentication required", 0},
	app.CodeInvalidCreds:      {http.StatusUnauthorized, "Invalid credentials", 0},
	"invalid_signature":       {http.StatusUnauthorized, "Invalid signature", 0}, // answered by webhook.Handler
	"signature_expired":       {http.StatusUnauthorized, "Signature expired", 0}, // answered by webhook.Handler
	"csrf_rejected":           {http.StatusForbidden, "Cross-site request refused", 0},
	app.CodeNotFound:          {http.StatusNotFound, "Not found", 0},
	"method_not_allowed":      {http.StatusMethodNotAllowed, "Method not allowed", 0},
	app.CodeUsernameTaken:     {http.StatusConflict, "Username taken", 0},
	app.CodePaymentInProgress: {http.StatusConflict, "Payment in progress", 1},
	app.CodeAlreadyPaid:       {http.StatusConflict, "Order already paid", 0},
	app.CodeNotifyConflict:    {http.StatusConflict, "Notification conflict", 0},
	"body_too_large":          {http.StatusRequestEntityTooLarge, "Request body too large", 0},
	"unsupported_media_type":  {http.StatusUnsupportedMediaType, "Unsupported media type", 0},
	app.CodeInsufficientFunds: {http.StatusUnprocessableEntity, "Insufficient funds", 0},
	app.CodeBalanceLimit:      {http.StatusUnprocessableEntity, "Balance limit", 0},
	app.CodeKeyReused:         {http.StatusUnprocessableEntity, "Idempotency-Key reused", 0},
	"rate_limited":            {http.StatusTooManyRequests, "Too many requests", 0},
	"too_many_attempts":       {http.StatusTooManyRequests, "Too many sign-in attempts", 0},
	"too_many_signups":        {http.StatusTooManyRequests, "Too many sign-ups", 0},
	app.CodeInternal:          {http.StatusInternalServerError, "Internal error", 0},
	app.CodeBusy:              {http.StatusServiceUnavailable, "Busy", 1},
	app.CodeInterrupted:       {http.StatusServiceUnavailable, "Request interrupted", 1},
	app.CodeUnavailable:       {http.StatusServiceUnavailable, "Service unavailable", 2},
}

// Codes returns every error code the handlers answer, besides the Idempotency-Key middleware's.
func Codes() []string {
	out := make([]string, 0, len(codes))
	for c := range codes {
		out = append(out, c)
	}
	return out
}

// problemFor is code's answer with detail.
func problemFor(code, detail string) *idempotency.Problem {
	a, ok := codes[code]
	if !ok {
		code, a = app.CodeInternal, codes[app.CodeInternal]
	}
	return &idempotency.Problem{Status: a.status, Code: code, Title: a.title, Detail: detail, RetryAfter: a.retryAfter}
}

// problem is err's answer: its own for a decode problem or an *app.Error, then 503
// request_interrupted when the request's context was cancelled (the client went away),
// 503 store_unavailable when the database could not answer, else 500 internal.
func (s *server) problem(err error) *idempotency.Problem {
	var (
		p  *idempotency.Problem
		ae *app.Error
	)
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &ae) && ae.Code != app.CodeInternal:
		return problemFor(ae.Code, ae.Message)
	case errors.Is(err, context.Canceled):
		return problemFor(app.CodeInterrupted, "the request ended (the client went away) before it was answered; retry it")
	case errors.Is(err, app.ErrUnavailable), errors.Is(err, idempotency.ErrUnavailable):
		return problemFor(app.CodeUnavailable, "the database is unreachable; retry later")
	}
	return problemFor(app.CodeInternal, "something went wrong on our side")
}

// fail answers err, logging it when it is the service's failure.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	p := s.problem(err)
	switch {
	case p.Code == app.CodeInterrupted:
		// Nobody failed: the client went away before the answer.
		app.Logger(r.Context(), s.log).Info("request ended before it was answered", "status", p.Status, "error", err.Error())
	case p.Status >= 500 && p.Code != app.CodeBusy:
		app.Logger(r.Context(), s.log).Error("request failed", "status", p.Status, "error", err.Error())
	}
	writeProblem(w, p)
}

// tooMany answers 429 with code and a Retry-After of wait.
func tooMany(w http.ResponseWriter, code, detail string, wait time.Duration) {
	p := problemFor(code, detail)
	p.RetryAfter = retryAfter(wait)
	writeProblem(w, p)
}

func writeProblem(w http.ResponseWriter, p *idempotency.Problem) { idempotency.WriteProblem(w, p) }

func writeJSON(w http.ResponseWriter, status int, v any) { writeBody(w, status, jsonBody(v)) }

// writeBody answers status with body, JSON already encoded.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// jsonBody is v as the service sends it: JSON and a newline.
func jsonBody(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}
