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

// takeMembers implements membersDecoder.
func (a *amountRequest) takeMembers(m map[string]json.RawMessage) { a.Amount = m["amount"] }

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

// moveRequest is the service's request for the keyed call in r; ans keeps the body of the
// answer it stored, so that the response is the same bytes, encoded once.
func moveRequest(r *http.Request, a money.Amount, ans *storedAnswer) app.MoveRequest {
	call, _ := idempotency.FromContext(r.Context())
	rec := &app.KeyRecord{
		ID: call.ID, Lease: call.Lease,
		Answer: func(m app.Movement) app.Answer {
			body := movementBody(m)
			ans.m, ans.body = m, body
			resp := call.Response(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, body)
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

// storedAnswer is the last answer a request's key stored for a movement.
type storedAnswer struct {
	m    app.Movement
	body []byte
}

// bodyOf returns the stored body when it answers m as the response would, else nil.
func (a *storedAnswer) bodyOf(m app.Movement) []byte {
	if a.body == nil || a.m.ID != m.ID || a.m.Status != m.Status || a.m.Amount != m.Amount || !a.m.CreatedAt.Equal(m.CreatedAt) {
		return nil
	}
	return a.body
}

func (s *server) deposit(w http.ResponseWriter, r *http.Request) {
	a, err := decoded(r, s.amount)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var ans storedAnswer
	m, err := s.app.Deposit(r.Context(), moveRequest(r, a, &ans))
	s.answerMovement(w, r, m, &ans, err)
}

func (s *server) withdraw(w http.ResponseWriter, r *http.Request) {
	a, err := decoded(r, s.amount)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var ans storedAnswer
	m, err := s.app.Withdraw(r.Context(), moveRequest(r, a, &ans))
	if call, _ := idempotency.FromContext(r.Context()); call != nil && call.Refused(err) {
		return // the key is taken, or its window or token refused: the middleware answers
	}
	s.answerMovement(w, r, m, &ans, err)
}

// answerMovement answers a created (or found) movement, or the error; the body its key stored
// when it is m's.
func (s *server) answerMovement(w http.ResponseWriter, r *http.Request, m app.Movement, ans *storedAnswer, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body := ans.bodyOf(m)
	if body == nil {
		body = movementBody(m)
	}
	writeBody(w, http.StatusCreated, body)
}

// movementBody is jsonBody(movementJSON(m)), the same bytes, written without reflection or a
// map: a money request's answer is encoded on every request, to store and to send.
func movementBody(m app.Movement) []byte {
	created := ts(m.CreatedAt)
	if !plainJSON(m.ID) || !plainJSON(string(m.Status)) || !plainJSON(created) {
		return jsonBody(movementJSON(m)) // escapes what needs it
	}
	b := make([]byte, 0, 96+len(m.ID))
	b = append(b, `{"amount":"`...)
	b = m.Amount.Append(b)
	b = append(b, `","created_at":"`...)
	b = append(b, created...)
	b = append(b, `","id":"`...)
	b = append(b, m.ID...)
	b = append(b, `","status":"`...)
	b = append(b, m.Status...)
	return append(b, "\"}\n"...)
}

// plainJSON reports whether s is its own JSON string body: letters, digits and _-:.+ only
// (ids, statuses and RFC 3339 times), nothing encoding/json would escape.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == ':' || c == '.' || c == '+') {
			return false
		}
	}
	return true
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
