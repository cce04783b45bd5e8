package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/internal/app"
	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/webhook"
)

// eventIDRE is what a provider event's id may be.
var eventIDRE = regexp.MustCompile(`^evt_[A-Za-z0-9_-]{1,124}$`)

// notification is a provider callback's body (docs/api.md, "Provider notifications").
type notification struct {
	ID        string     `json:"id"`
	Type      string     `json:"type"`
	CreatedAt *time.Time `json:"created_at"`
	Operation *struct {
		ID     string          `json:"id"`
		Key    string          `json:"key"`
		Kind   string          `json:"kind"`
		Amount json.RawMessage `json:"amount"`
		Status string          `json:"status"`
	} `json:"operation"`
}

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
// status that agrees with the type; other members are ignored. Anything else is invalid_request.
func decodeNotification(body []byte) (app.Notification, error) {
	bad := func(detail string) error {
		return &idempotency.Problem{Status: http.StatusBadRequest, Code: app.CodeInvalid, Title: "Invalid request", Detail: detail}
	}
	if _, err := idempotency.Fingerprint(body); err != nil {
		return app.Notification{}, bad("the body must be one JSON object")
	}
	var n notification
	if err := json.Unmarshal(body, &n); err != nil {
		return app.Notification{}, bad("the body is not a provider notification")
	}
	switch {
	case !eventIDRE.MatchString(n.ID):
		return app.Notification{}, bad("id: an event id evt_...")
	case n.CreatedAt == nil:
		return app.Notification{}, bad("created_at: required")
	case n.Operation == nil:
		return app.Notification{}, bad("operation: required")
	case n.Operation.Key == "" || len(n.Operation.Key) > 255:
		return app.Notification{}, bad("operation.key: required")
	}
	out := app.Notification{EventID: n.ID, Key: n.Operation.Key}
	switch n.Operation.Kind {
	case "charge":
		out.Kind = app.Deposit
	case "payout":
		out.Kind = app.Withdrawal
	default:
		return app.Notification{}, bad("operation.kind: charge or payout")
	}
	switch {
	case n.Type == "operation.succeeded" && n.Operation.Status == "succeeded":
		out.Status = app.Succeeded
	case n.Type == "operation.failed" && n.Operation.Status == "failed":
		out.Status = app.Failed
	default:
		return app.Notification{}, bad("type and operation.status: operation.succeeded and succeeded, or operation.failed and failed")
	}
	a, err := money.FromJSON(n.Operation.Amount)
	if err != nil || a <= 0 {
		return app.Notification{}, bad("operation.amount: an amount like \"10.00\"")
	}
	out.Amount = a
	return out, nil
}
