package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/idempotency"
)

type orderRequest struct {
	Amount      json.RawMessage `json:"amount"`
	Description *string         `json:"description"`
}

// orderBody is an order's body, decoded and checked.
type orderBody struct {
	amount money.Amount
	desc   string
}

func (s *server) order(body []byte) (orderBody, error) {
	var req orderRequest
	if p := Decode(body, &req); p != nil {
		return orderBody{}, p
	}
	a, err := s.parseAmount(req.Amount)
	if err != nil {
		return orderBody{}, err
	}
	o := orderBody{amount: a}
	if req.Description != nil {
		o.desc = *req.Description
	}
	if err := s.app.CheckOrder(o.amount, o.desc); err != nil {
		return orderBody{}, err
	}
	return o, nil
}

func (s *server) orderFingerprint(r *http.Request, body []byte) (string, error) {
	o, err := s.order(body)
	if err != nil {
		return "", s.problem(err)
	}
	info(r).body = o
	b, _ := json.Marshal([]any{"order", int64(o.amount), o.desc})
	return string(b), nil
}

// paymentMethod checks a payment's body: {"method": "wallet"}.
func paymentMethod(body []byte) (struct{}, error) {
	var req struct {
		Method *string `json:"method"`
	}
	if p := Decode(body, &req); p != nil {
		return struct{}{}, p
	}
	if req.Method == nil {
		return struct{}{}, Missing("method")
	}
	if *req.Method != "wallet" {
		return struct{}{}, problemFor(app.CodeInvalid, "method: only \"wallet\"")
	}
	return struct{}{}, nil
}

func (s *server) paymentFingerprint(_ *http.Request, body []byte) (string, error) {
	if _, err := paymentMethod(body); err != nil {
		return "", err
	}
	return "payment:wallet", nil
}

// OrderResource is an order as its GET answers it (and as its event
// carries it).
func OrderResource(o app.Order) map[string]any { return orderJSON(o) }

func orderJSON(o app.Order) map[string]any {
	m := map[string]any{"id": o.ID, "order_no": o.OrderNo, "amount": o.Amount, "description": o.Description, "status": o.Status, "created_at": ts(o.CreatedAt)}
	if o.PaymentID != "" {
		m["payment_id"] = o.PaymentID // links the ledger's payment entry (its ref) to the order
	}
	return m
}

func (s *server) createOrder(w http.ResponseWriter, r *http.Request) {
	o, err := decoded(r, s.order)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	call, _ := idempotency.FromContext(r.Context())
	created, err := s.app.CreateOrder(r.Context(), app.OrderRequest{UserID: call.Scope.Principal, Key: call.Key, Amount: o.amount, Description: o.desc})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, orderJSON(created))
}

func (s *server) listOrders(w http.ResponseWriter, r *http.Request) {
	orders, err := s.app.Orders(r.Context(), userFrom(r.Context()).ID, 1000)
	writeList(s, w, r, orders, err, orderJSON)
}

func (s *server) getOrder(w http.ResponseWriter, r *http.Request) {
	o, err := s.app.Order(r.Context(), userFrom(r.Context()).ID, r.PathValue("id"))
	writeOne(s, w, r, o, err, orderJSON)
}

// pay answers an order's payment; a payment in progress frees its key, as the retry must run again.
func (s *server) pay(w http.ResponseWriter, r *http.Request) {
	call, _ := idempotency.FromContext(r.Context())
	p, err := s.app.Pay(r.Context(), app.PayRequest{UserID: call.Scope.Principal, Key: call.Key, OrderID: r.PathValue("id")})
	if app.ErrorCode(err) == app.CodePaymentInProgress {
		call.Forget()
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"order_id": p.OrderID, "payment_id": p.ID, "status": "paid", "amount": p.Amount})
}
