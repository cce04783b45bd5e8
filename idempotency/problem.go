package idempotency

import (
	"net/http"
)

// Problem is an RFC 9457 problem detail with the machine-readable code
// clients branch on.
type Problem struct {
	Status     int    // HTTP status
	Code       string // snake_case, stable
	Title      string // short, human
	Detail     string // this occurrence, human
	RetryAfter int    // seconds; sent as Retry-After when > 0

	next, nextExpires string // Options.OfferToken: the next submit token, sent with the problem
}

// Error returns the problem's code and detail: a Problem is an error, so
// a Principal or Fingerprint func can return one to be answered as it is.
func (p *Problem) Error() string { return p.Code + ": " + p.Detail }

// WriteProblem writes p as application/problem+json, with Cache-Control:
// no-store, Retry-After when set and the next submit token when the Guard
// offered one (Options.OfferToken).
func WriteProblem(w http.ResponseWriter, p *Problem) {
	header, body := ProblemBody(p)
	h := w.Header()
	for k, v := range header {
		h[k] = v
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// problemJSON is p's RFC 9457 body.
func problemJSON(p *Problem) any {
	return struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
	}{"urn:onceguard:problem:" + p.Code, p.Title, p.Status, p.Detail, p.Code}
}

// The problems Middleware answers with (docs/api.md's codes).
var (
	probTooLarge = &Problem{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Title: "Request body too large"}
	probAuth     = &Problem{Status: http.StatusUnauthorized, Code: "unauthenticated", Title: "Authentication required", Detail: "sign in first"}
	probMissing  = &Problem{Status: http.StatusBadRequest, Code: "idempotency_key_missing", Title: "Idempotency-Key missing",
		Detail: "send an Idempotency-Key header: a unique key per intended request, reused only for its retries"}
	probInvalid = &Problem{Status: http.StatusBadRequest, Code: "idempotency_key_invalid", Title: "Idempotency-Key invalid",
		Detail: "send exactly one Idempotency-Key of 1..255 characters from '!' to '~' without '\"', bare or quoted"}
	probJSON          = &Problem{Status: http.StatusBadRequest, Code: "invalid_json", Title: "Invalid JSON"}
	probTokenInvalid  = &Problem{Status: http.StatusBadRequest, Code: "submit_token_invalid", Title: "Submit token invalid", Detail: "the submit token is unknown, expired, not yours, for another purpose or already used for another request; fetch a new one"}
	probTokenRequired = &Problem{Status: http.StatusBadRequest, Code: "submit_token_required", Title: "Submit token required", Detail: "this request needs a submit token (POST /api/v1/submit-tokens) as its Idempotency-Key"}
	probInProgress    = &Problem{Status: http.StatusConflict, Code: "request_in_progress", Title: "Request in progress", Detail: "the first request with this key is still running; retry shortly", RetryAfter: 1}
	probReused        = &Problem{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused", Title: "Idempotency-Key reused", Detail: "this key was already used for a different request; use a new key"}
	probUnavailable   = &Problem{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Title: "Service unavailable", Detail: "duplicate protection is unavailable, so nothing was processed; retry later", RetryAfter: 2}
	probInterrupted   = &Problem{Status: http.StatusServiceUnavailable, Code: "request_interrupted", Title: "Request interrupted", Detail: "the request ended (its deadline passed or the client went away) before it was answered; nothing was stored, so a retry with this key runs again", RetryAfter: 1}
)
