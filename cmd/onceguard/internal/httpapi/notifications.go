package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/webhook"
)

// eventIDRE is what a provider event's id may be.
var eventIDRE = regexp.MustCompile(`^evt_[A-Za-z0-9_-]{1,124}$`)

// notifications serves POST /api/v1/psp/notifications: no session, no CSRF check and no
// Idempotency-Key, the signature authenticates it; then the body, then the domain's answer.
func (s *server) notifications() http.Handler {
	verify := webhook.Onceguard{Secrets: [][]byte{s.cfg.NotifySecret}, Tolerance: webhook.DefaultTolerance}
	return webhook.Handler(webhook.Config{
		Verifier: verify, MaxBody: MaxBody,
		OnReject: func(r *http.Request, err error) {
			outcome := "invalid_signature"
			if errors.Is(err, webhook.ErrSignatureExpired) {
				outcome = "signature_expired"
			}
			s.countNotification(outcome)
			app.Logger(r.Context(), s.log).Warn("provider notification refused", "reason", outcome)
		},
	}, http.HandlerFunc(s.notify))
}

func (s *server) notify(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body) // the verified raw body, in memory
	n, err := decodeNotification(body)
	if err != nil {
		s.countNotification("invalid_request")
		s.fail(w, r, err)
		return
	}
	if !idRE.MatchString(n.Key) { // our ids only: anything else names no movement, on every database
		s.countNotification("not_found")
		s.fail(w, r, app.ErrNotFound)
		return
	}
	if err := s.app.Notify(r.Context(), n); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent) // after the settlement's commit
}

func (s *server) countNotification(outcome string) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.CountNotification(outcome)
	}
}

// decodeNotification reads a callback's body: one JSON object (no member twice) with an
// evt_ id, a known type, created_at, and the operation's key, kind, amount and a final
// status that agrees with the type; other members are ignored. Members are matched by
// their exact names. Anything else is invalid_request.
func decodeNotification(body []byte) (app.Notification, error) {
	bad := func(detail string) (app.Notification, error) {
		return app.Notification{}, &idempotency.Problem{Status: http.StatusBadRequest, Code: app.CodeInvalid, Title: "Invalid request", Detail: detail}
	}
	if _, err := idempotency.Fingerprint(body); err != nil {
		return bad("the body must be one JSON object")
	}
	top, ok := members(body)
	if !ok {
		return bad("the body must be one JSON object")
	}
	op, ok := members(top["operation"])
	if !ok {
		return bad("operation: an object")
	}
	id, _ := str(top["id"])
	typ, _ := str(top["type"])
	created, _ := str(top["created_at"])
	key, _ := str(op["key"])
	kind, _ := str(op["kind"])
	status, _ := str(op["status"])
	if !eventIDRE.MatchString(id) {
		return bad("id: an event id evt_...")
	}
	if _, err := time.Parse(time.RFC3339, created); err != nil {
		return bad("created_at: an RFC 3339 time")
	}
	if key == "" || len(key) > 255 {
		return bad("operation.key: required")
	}
	n := app.Notification{EventID: id, Key: key}
	switch kind {
	case "charge":
		n.Kind = app.Deposit
	case "payout":
		n.Kind = app.Withdrawal
	default:
		return bad("operation.kind: charge or payout")
	}
	switch {
	case typ == "operation.succeeded" && status == "succeeded":
		n.Status = app.Succeeded
	case typ == "operation.failed" && status == "failed":
		n.Status = app.Failed
	default:
		return bad("type and operation.status: operation.succeeded and succeeded, or operation.failed and failed")
	}
	a, err := money.FromJSON(op["amount"])
	if err != nil || a <= 0 {
		return bad("operation.amount: an amount like \"10.00\"")
	}
	n.Amount = a
	return n, nil
}

// members is raw's members when it is a JSON object.
func members(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

// str is raw's value when it is a JSON string.
func str(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}
