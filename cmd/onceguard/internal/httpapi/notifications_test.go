package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/webhook"
)

var notifySecret = []byte("whsec_test")

// callback sends body to the notifications route with the signature of
// signed ("": body) at t with secret (nil: no signature header) and returns
// the status and the problem's code.
func callback(h http.Handler, secret []byte, t time.Time, contentType, body, signed string) (int, string) {
	req := httptest.NewRequest("POST", "/api/v1/psp/notifications", strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	if signed == "" {
		signed = body
	}
	if secret != nil {
		req.Header.Set(webhook.OnceguardHeader, webhook.Onceguard{}.Sign(secret, t, []byte(signed)))
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var p struct{ Code string }
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	return w.Code, p.Code
}

func event(id, typ, key, kind, amount, status string) string {
	return fmt.Sprintf(`{"id":%q,"type":%q,"created_at":"2026-01-02T03:04:05Z","operation":{"id":"op_1","key":%q,"kind":%q,"amount":%q,"status":%q,"created_at":"2026-01-02T03:04:05Z"}}`,
		id, typ, key, kind, amount, status)
}

// The callback endpoint answers in the contract's order, settles a pending
// deposit once whatever is redelivered, and refuses contradictions without
// changing anything, counting them.
func TestNotifications(t *testing.T) {
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) {
		c.NotifySecret = notifySecret
		c.App.NotifyMetrics = c.Metrics
		// Answers pending and, without Run, never settles: only callbacks do here.
		c.Provider = obs.Provider{Provider: &psp.Sim{Async: true}, Metrics: c.App.Metrics.(*obs.Metrics)}
	})
	code, dep, _ := o.call("POST", "/api/v1/deposits", "dep-1", `{"amount":"10"}`)
	if code != 201 || dep["status"] != "pending" {
		t.Fatalf("deposit = %d %v; want 201 pending", code, dep)
	}
	id := dep["id"].(string)
	balance := func() any {
		_, acct, _ := o.call("GET", "/api/v1/account", "", "")
		return acct["balance"]
	}
	now := time.Now()
	good := event("evt_1", "operation.succeeded", id, "charge", "10.00", "succeeded")
	flipped := []byte(good)
	flipped[len(flipped)/2] ^= 1
	for _, tc := range []struct {
		name        string
		secret      []byte
		at          time.Time
		contentType string
		body        string
		signed      string
		status      int
		code        string
	}{
		{"no signature", nil, now, "application/json", good, "", 401, "invalid_signature"},
		{"forged", []byte("guess"), now, "application/json", good, "", 401, "invalid_signature"},
		{"replayed after 5 minutes", notifySecret, now.Add(-5*time.Minute - 2*time.Second), "application/json", good, "", 401, "signature_expired"},
		{"from the future", notifySecret, now.Add(6 * time.Minute), "application/json", good, "", 401, "signature_expired"},
		{"forged, not JSON, not application/json", []byte("guess"), now, "text/plain", "nope", "", 401, "invalid_signature"},
		{"not JSON", notifySecret, now, "application/json", "nope", "", 400, "invalid_request"},
		{"duplicate member", notifySecret, now, "application/json", `{"id":"evt_1","id":"evt_2"}`, "", 400, "invalid_request"},
		{"no operation", notifySecret, now, "application/json", `{"id":"evt_1","type":"operation.succeeded","created_at":"2026-01-02T03:04:05Z"}`, "", 400, "invalid_request"},
		{"type and status disagree", notifySecret, now, "application/json", event("evt_1", "operation.succeeded", id, "charge", "10.00", "failed"), "", 400, "invalid_request"},
		{"bad amount", notifySecret, now, "application/json", event("evt_1", "operation.succeeded", id, "charge", "1e3", "succeeded"), "", 400, "invalid_request"},
		{"bad event id", notifySecret, now, "application/json", event("1", "operation.succeeded", id, "charge", "10.00", "succeeded"), "", 400, "invalid_request"},
		{"a key that is no id of ours", notifySecret, now, "application/json", event("evt_1", "operation.succeeded", "DEP/1 x", "charge", "10.00", "succeeded"), "", 404, "not_found"},
		{"unknown key", notifySecret, now, "application/json", event("evt_1", "operation.succeeded", "dep_nope", "charge", "10.00", "succeeded"), "", 404, "not_found"},
		{"other amount", notifySecret, now, "application/json", event("evt_1", "operation.succeeded", id, "charge", "10.01", "succeeded"), "", 409, "notification_conflict"},
		{"other kind", notifySecret, now, "application/json", event("evt_1", "operation.succeeded", id, "payout", "10.00", "succeeded"), "", 409, "notification_conflict"},
		{"settles", notifySecret, now, "application/json", good, "", 204, ""},
		{"the same event again", notifySecret, now, "application/json", good, "", 204, ""},
		{"another event agreeing", notifySecret, now, "application/json", event("evt_2", "operation.succeeded", id, "charge", "10", "succeeded"), "", 204, ""},
		{"a stale failure", notifySecret, now, "application/json", event("evt_3", "operation.failed", id, "charge", "10.00", "failed"), "", 409, "notification_conflict"},
		{"the first, bit-flipped", notifySecret, now, "application/json", string(flipped), good, 401, "invalid_signature"},
	} {
		if status, code := callback(o.h, tc.secret, tc.at, tc.contentType, tc.body, tc.signed); status != tc.status || code != tc.code {
			t.Errorf("%s: %d %q; want %d %q", tc.name, status, code, tc.status, tc.code)
		}
		if tc.status != 204 {
			continue
		}
		if got := balance(); got != "10.00" {
			t.Errorf("%s: balance %v; want 10.00, credited once", tc.name, got)
		}
	}
	if got := balance(); got != "10.00" {
		t.Errorf("balance %v; want 10.00", got)
	}
	if _, d, _ := o.call("GET", "/api/v1/deposits/"+id, "", ""); d["status"] != "succeeded" {
		t.Errorf("deposit after the callbacks = %v; want succeeded", d)
	}
	// The key's replay is the 201 pending it answered first.
	if code, again, _ := o.call("POST", "/api/v1/deposits", "dep-1", `{"amount":"10"}`); code != 201 || again["status"] != "pending" {
		t.Errorf("replay = %d %v; want the first 201 pending", code, again)
	}
	for outcome, want := range map[string]float64{"settled": 1, "agreed": 2, "conflict": 3, "not_found": 2,
		"invalid_signature": 4, "signature_expired": 2, "invalid_request": 6} {
		if got := o.value(t, "onceguard_psp_notifications_total", "outcome", outcome); got != want {
			t.Errorf("onceguard_psp_notifications_total{outcome=%q} = %v; want %v", outcome, got, want)
		}
	}
	if n := len(o.lines(t, "provider notification conflict")); n != 3 {
		t.Errorf("%d conflict log lines; want 3", n)
	}
	for _, l := range o.lines(t, "provider notification conflict") {
		if l["level"] != "ERROR" {
			t.Errorf("conflict logged at %v; want ERROR", l["level"])
		}
	}
}

// Without a secret the route does not exist.
func TestNotificationsOff(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	if status, code := callback(o.h, notifySecret, time.Now(), "application/json", event("evt_1", "operation.succeeded", "dep_1", "charge", "1", "succeeded"), ""); status != 404 || code != "not_found" {
		t.Errorf("callback without --psp-notify-secret = %d %q; want 404 not_found", status, code)
	}
}

// settleFaults fails the next settlements as told: undone (the transaction rolled back: nothing
// written) or after (it committed, and the error came after: a connection lost on COMMIT's
// answer).
type settleFaults struct {
	app.Store
	undone, after atomic.Int32
}

func (f *settleFaults) Settle(ctx context.Context, kind app.Kind, id string, outcome app.Status, at time.Time, rec *app.Record, event string) (bool, app.Status, error) {
	if f.undone.Add(-1) >= 0 {
		return false, "", errors.New("fault: the settlement's transaction rolled back")
	}
	moved, status, err := f.Store.Settle(ctx, kind, id, outcome, at, rec, event)
	if err == nil && f.after.Add(-1) >= 0 {
		return false, "", errors.New("fault: the connection broke on COMMIT's answer")
	}
	return moved, status, err
}

// A callback is answered 2xx only once its settlement committed (PITFALLS: "answer 2xx only
// after the commit"): a settlement that fails answers 5xx, so the provider redelivers, and
// nothing changed; the redelivery settles it once. One that committed but whose answer was
// lost also answers 5xx, and its redelivery agrees without moving money again.
func TestNotificationAnsweredAfterCommit(t *testing.T) {
	faults := &settleFaults{}
	o := newObsHarness(t, nil, nil, func(c *harnessConfig) {
		c.NotifySecret = notifySecret
		c.App.NotifyMetrics = c.Metrics
		c.Provider = obs.Provider{Provider: &psp.Sim{Async: true}, Metrics: c.App.Metrics.(*obs.Metrics)}
		c.WrapStore = func(s app.Store) app.Store { faults.Store = s; return faults }
	})
	deposit := func(key string) string {
		t.Helper()
		code, dep, _ := o.call("POST", "/api/v1/deposits", key, `{"amount":"10"}`)
		id, _ := dep["id"].(string)
		if code != 201 || dep["status"] != "pending" || id == "" {
			t.Fatalf("deposit = %d %v; want 201 pending", code, dep)
		}
		return id
	}
	state := func(id string) (any, any) {
		t.Helper()
		_, acct, _ := o.call("GET", "/api/v1/account", "", "")
		_, d, _ := o.call("GET", "/api/v1/deposits/"+id, "", "")
		return acct["balance"], d["status"]
	}
	now := time.Now()

	// Rolled back: 5xx, still pending, nothing credited; the redelivery settles it.
	first := deposit("dep-1")
	ev := event("evt_1", "operation.succeeded", first, "charge", "10.00", "succeeded")
	faults.undone.Store(1)
	if status, code := callback(o.h, notifySecret, now, "application/json", ev, ""); status < 500 {
		t.Errorf("callback whose settlement rolled back = %d %q; want a 5xx, so that the provider redelivers", status, code)
	}
	if bal, st := state(first); bal != "0.00" || st != "pending" {
		t.Errorf("after the failed settlement: balance %v, deposit %v; want 0.00, pending", bal, st)
	}
	if status, code := callback(o.h, notifySecret, now, "application/json", ev, ""); status != 204 {
		t.Errorf("redelivery = %d %q; want 204", status, code)
	}
	if bal, st := state(first); bal != "10.00" || st != "succeeded" {
		t.Errorf("after the redelivery: balance %v, deposit %v; want 10.00, succeeded", bal, st)
	}

	// Committed, the answer lost: 5xx; the redelivery agrees and credits nothing more.
	second := deposit("dep-2")
	ev = event("evt_2", "operation.succeeded", second, "charge", "10.00", "succeeded")
	faults.after.Store(1)
	if status, code := callback(o.h, notifySecret, now, "application/json", ev, ""); status < 500 {
		t.Errorf("callback whose commit's answer was lost = %d %q; want a 5xx", status, code)
	}
	if status, code := callback(o.h, notifySecret, now, "application/json", ev, ""); status != 204 {
		t.Errorf("redelivery = %d %q; want 204", status, code)
	}
	if bal, st := state(second); bal != "20.00" || st != "succeeded" {
		t.Errorf("after the redelivery: balance %v, deposit %v; want 20.00 (each credited once), succeeded", bal, st)
	}
	for outcome, want := range map[string]float64{"settled": 1, "agreed": 1} {
		if got := o.value(t, "onceguard_psp_notifications_total", "outcome", outcome); got != want {
			t.Errorf("onceguard_psp_notifications_total{outcome=%q} = %v; want %v", outcome, got, want)
		}
	}
}
