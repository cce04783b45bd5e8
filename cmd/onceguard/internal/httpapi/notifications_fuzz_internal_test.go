package httpapi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/idempotency"
)

// FuzzNotificationBody feeds the callback decoder arbitrary (verified)
// bodies. It must never panic; it accepts a body only if it is one JSON
// object, no member twice, with an evt_ id, created_at, a known type whose
// status the operation repeats, a charge or payout, a key and a positive
// amount, decided here independently; the notification it returns says
// exactly what the body says. Anything else is 400 invalid_request.
func FuzzNotificationBody(f *testing.F) {
	good := `{"id":"evt_1","type":"operation.succeeded","created_at":"2026-01-02T03:04:05Z","operation":{"id":"op_1","key":"dep_1","kind":"charge","amount":"10.00","status":"succeeded","created_at":"2026-01-02T03:04:05Z"}}`
	for _, s := range []string{
		good,
		strings.Replace(good, "succeeded", "failed", 2),
		strings.Replace(good, `"operation.succeeded"`, `"operation.failed"`, 1),
		strings.Replace(good, `"charge"`, `"payout"`, 1),
		strings.Replace(good, `"charge"`, `"refund"`, 1),
		strings.Replace(good, `"10.00"`, `10`, 1),
		strings.Replace(good, `"10.00"`, `"-1"`, 1),
		strings.Replace(good, `"10.00"`, `1e400`, 1),
		strings.Replace(good, `"evt_1"`, `"evt_1","id":"evt_2"`, 1),
		strings.Replace(good, `"evt_1"`, `"EVT_1"`, 1),
		strings.Replace(good, `"key":"dep_1"`, `"key":""`, 1),
		strings.Replace(good, `"created_at":"2026-01-02T03:04:05Z",`, ``, 1),
		`{"id":"evt_1","type":"operation.succeeded","created_at":"2026-01-02T03:04:05Z","operation":null}`,
		good + `{}`, `[]`, `null`, ``, `{}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := decodeNotification(body)
		var p *idempotency.Problem
		if err != nil {
			if !errorsAs(err, &p) || p.Status != 400 || p.Code != app.CodeInvalid {
				t.Fatalf("%q: error %v; want 400 invalid_request", body, err)
			}
			if n != (app.Notification{}) {
				t.Fatalf("%q: error with a notification %+v", body, n)
			}
		}
		want, ok := referenceNotification(body)
		switch {
		case ok && err != nil:
			t.Fatalf("%q refused (%v); want %+v", body, err, want)
		case !ok && err == nil:
			t.Fatalf("%q accepted as %+v; want invalid_request", body, n)
		case ok && n != want:
			t.Fatalf("%q = %+v; want %+v", body, n, want)
		}
	})
}

func errorsAs(err error, p **idempotency.Problem) bool {
	q, ok := err.(*idempotency.Problem)
	*p = q
	return ok
}

// referenceNotification decides a body's meaning without the decoder: a generic parse.
func referenceNotification(body []byte) (app.Notification, bool) {
	if _, err := idempotency.Fingerprint(body); err != nil {
		return app.Notification{}, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil || top == nil {
		return app.Notification{}, false
	}
	op, _ := top["operation"].(map[string]any)
	if op == nil {
		return app.Notification{}, false
	}
	id, _ := top["id"].(string)
	typ, _ := top["type"].(string)
	created, _ := top["created_at"].(string)
	key, _ := op["key"].(string)
	kind, _ := op["kind"].(string)
	status, _ := op["status"].(string)
	if _, err := time.Parse(time.RFC3339, created); err != nil || !strings.HasPrefix(id, "evt_") || !eventIDRE.MatchString(id) || key == "" || len(key) > 255 {
		return app.Notification{}, false
	}
	n := app.Notification{EventID: id, Key: key, Kind: map[string]app.Kind{"charge": app.Deposit, "payout": app.Withdrawal}[kind]}
	if n.Kind == "" {
		return app.Notification{}, false
	}
	switch {
	case typ == "operation.succeeded" && status == "succeeded":
		n.Status = app.Succeeded
	case typ == "operation.failed" && status == "failed":
		n.Status = app.Failed
	default:
		return app.Notification{}, false
	}
	var raw []byte
	switch v := op["amount"].(type) {
	case string:
		raw, _ = json.Marshal(v)
	case json.Number:
		raw = []byte(v.String())
	default:
		return app.Notification{}, false
	}
	a, err := money.FromJSON(raw)
	if err != nil || a <= 0 {
		return app.Notification{}, false
	}
	n.Amount = a
	return n, true
}
