package httpapi

import (
	"fmt"
	"net/http"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

// ts is a time as the API writes it.
func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (s *server) account(w http.ResponseWriter, r *http.Request) {
	u := userFrom(r.Context())
	a, err := s.app.Account(r.Context(), u.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"user_id": u.ID, "username": u.Username, "balance": a.Balance, "currency": a.Currency})
}

// ledger answers the whole journal: its amounts must sum to the balance
// (docs/api.md), so it is never cut short like the other lists.
func (s *server) ledger(w http.ResponseWriter, r *http.Request) {
	entries, err := s.app.Ledger(r.Context(), userFrom(r.Context()).ID)
	writeList(s, w, r, entries, err, func(e app.LedgerEntry) map[string]any {
		return map[string]any{"id": fmt.Sprint(e.ID), "kind": e.Kind, "amount": e.Amount, "balance_after": e.BalanceAfter, "ref": e.Ref, "created_at": ts(e.CreatedAt)}
	})
}

var purposes = map[string]bool{"withdrawal": true, "deposit": true, "order": true, "payment": true}

// Purpose reports whether p is a submit token purpose (a key of
// Config.RequireToken): withdrawal, deposit, order or payment.
func Purpose(p string) bool { return purposes[p] }

func (s *server) createSubmitToken(w http.ResponseWriter, r *http.Request) {
	body, p := ReadBody(r)
	var req struct {
		Purpose *string `json:"purpose"`
	}
	if p == nil {
		p = Decode(body, &req)
	}
	if p == nil && req.Purpose == nil {
		p = Missing("purpose")
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	if !purposes[*req.Purpose] {
		writeProblem(w, problemFor(app.CodeInvalidPurpose, "one of withdrawal, deposit, order, payment"))
		return
	}
	is, err := s.tokens.Issue(r.Context(), userFrom(r.Context()).ID, *req.Purpose)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if m := s.cfg.Metrics; m != nil {
		m.Tokens.WithLabelValues("issued").Inc()
	}
	writeJSON(w, http.StatusCreated, map[string]string{"token": is.Token, "purpose": is.Purpose, "expires_at": ts(is.ExpiresAt)})
}

// writeList answers {"items": [...]} (newest first, as the store gives
// them), or the store's error.
func writeList[T any](s *server, w http.ResponseWriter, r *http.Request, items []T, err error, toJSON func(T) map[string]any) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]map[string]any, 0, len(items))
	for _, it := range items {
		out = append(out, toJSON(it))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": out})
}

// writeOne answers one resource; another user's, like a missing one, is
// 404 not_found.
func writeOne[T any](s *server, w http.ResponseWriter, r *http.Request, item T, err error, toJSON func(T) map[string]any) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(item))
}
