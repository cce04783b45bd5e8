package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/idempotency"
)

// amountRequest is the body of a deposit or a withdrawal.
type amountRequest struct {
	Amount json.RawMessage `json:"amount"`
}

// amount decodes {"amount": ...} under the contract's rules.
func (s *server) amount(body []byte) (money.Amount, error) {
	var req amountRequest
	if p := Decode(body, &req); p != nil {
		return 0, p
	}
	return s.parseAmount(req.Amount)
}

// parseAmount is a JSON amount, checked against the service's limits.
func (s *server) parseAmount(raw json.RawMessage) (money.Amount, error) {
	if raw == nil {
		return 0, Missing("amount")
	}
	a, err := money.FromJSON(raw)
	if err != nil {
		a = 0 // refused below, with the same answer
	}
	if err := s.app.CheckAmount(a); err != nil {
		return 0, err
	}
	return a, nil
}

// amountFingerprint decodes a deposit's or withdrawal's body for the handler; bodies compare
// by value: "7", "7.00" and 7 are one body.
func (s *server) amountFingerprint(purpose string) func(*http.Request, []byte) (string, error) {
	return func(r *http.Request, body []byte) (string, error) {
		a, err := s.amount(body)
		if err != nil {
			return "", s.problem(err)
		}
		info(r).body = a
		return purpose + ":" + fmt.Sprint(int64(a)), nil
	}
}

// decoded is the body the route's fingerprint decoded, or decode's reading of the body when
// the middleware had no need of a fingerprint.
func decoded[T any](r *http.Request, decode func([]byte) (T, error)) (T, error) {
	if v, ok := info(r).body.(T); ok {
		return v, nil
	}
	body, p := ReadBody(r)
	if p != nil {
		var zero T
		return zero, p
	}
	return decode(body)
}

// moveRequest is the service's request for the keyed call in r.
func moveRequest(r *http.Request, a money.Amount) app.MoveRequest {
	call, _ := idempotency.FromContext(r.Context())
	rec := &app.KeyRecord{
		ID: call.ID, Lease: call.Lease,
		Answer: func(m app.Movement) app.Answer {
			resp := call.Response(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, jsonBody(movementJSON(m)))
			return app.Answer{Status: resp.Status, Header: resp.Header, Body: resp.Body}
		},
		Completed: call.MarkCompleted,
		Transient: call.Forget,
	}
	if st := call.Start(); st != nil { // Deferred: created in the withdrawal's transaction
		rec.Start, rec.Created = st, call.Created
	}
	return app.MoveRequest{UserID: call.Scope.Principal, Key: call.Key, Amount: a, SessionHash: info(r).sessionHash, Record: rec}
}

func (s *server) deposit(w http.ResponseWriter, r *http.Request) {
	a, err := decoded(r, s.amount)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	m, err := s.app.Deposit(r.Context(), moveRequest(r, a))
	s.answerMovement(w, r, m, err)
}

func (s *server) withdraw(w http.ResponseWriter, r *http.Request) {
	a, err := decoded(r, s.amount)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	m, err := s.app.Withdraw(r.Context(), moveRequest(r, a))
	if call, _ := idempotency.FromContext(r.Context()); call != nil && call.Refused(err) {
		return // the key is taken, or its window or token refused: the middleware answers
	}
	s.answerMovement(w, r, m, err)
}

// answerMovement answers a created (or found) movement, or the error.
func (s *server) answerMovement(w http.ResponseWriter, r *http.Request, m app.Movement, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, movementJSON(m))
}

// MovementResource is a deposit or withdrawal as its GET answers it (and
// as its event carries it).
func MovementResource(m app.Movement) map[string]any { return movementJSON(m) }

func movementJSON(m app.Movement) map[string]any {
	return map[string]any{"id": m.ID, "amount": m.Amount, "status": m.Status, "created_at": ts(m.CreatedAt)}
}

func (s *server) listMovements(kind app.Kind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, err := s.app.Movements(r.Context(), kind, userFrom(r.Context()).ID, 1000)
		writeList(s, w, r, ms, err, movementJSON)
	})
}

func (s *server) getMovement(kind app.Kind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m, err := s.app.Movement(r.Context(), kind, userFrom(r.Context()).ID, r.PathValue("id"))
		writeOne(s, w, r, m, err, movementJSON)
	})
}
