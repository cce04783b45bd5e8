package httpapi

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// TestMovementBody: the hand-written answer of a money request is byte for byte what
// encoding/json writes for the resource, plain or in need of escapes; a replay depends on it.
func TestMovementBody(t *testing.T) {
	at := time.Date(2026, 12, 6, 0, 1, 23, 456, time.FixedZone("x", 3600))
	for _, m := range []app.Movement{
		{ID: "wd_01a248a7c223e1f98a0e805134d7", Amount: 100, Status: app.Succeeded, CreatedAt: at},
		{ID: "dep_1", Amount: 1, Status: app.Pending, CreatedAt: at},
		{ID: "wd_2", Amount: math.MaxInt64, Status: app.Failed, CreatedAt: at},
		{ID: "wd_3", Amount: -5, Status: app.Failed, CreatedAt: time.Time{}},
		{ID: `wd_"<&>\` + "\u2028é\x01", Amount: 750, Status: app.Succeeded, CreatedAt: at},
		{ID: "wd_4", Amount: 1, Status: app.Status("odd status"), CreatedAt: at},
		{ID: "wd_5", Amount: 1, Status: app.Succeeded, CreatedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{},
	} {
		if got, want := movementBody(m), jsonBody(movementJSON(m)); !bytes.Equal(got, want) {
			t.Errorf("movementBody(%+v)\n got %s\nwant %s", m, got, want)
		}
	}
}

// TestStoredAnswerReused: the response reuses the stored body only for the movement it was
// stored for, as that movement is now.
func TestStoredAnswerReused(t *testing.T) {
	at := time.Unix(1796500000, 0)
	m := app.Movement{ID: "wd_1", Amount: money.Amount(100), Status: app.Succeeded, CreatedAt: at}
	var ans storedAnswer
	if ans.bodyOf(m) != nil {
		t.Fatal("an empty storedAnswer has a body")
	}
	ans.m, ans.body = m, movementBody(m)
	if !bytes.Equal(ans.bodyOf(m), ans.body) {
		t.Fatal("the stored body is not reused for its own movement")
	}
	same := m
	same.CreatedAt = at.In(time.FixedZone("y", 7200)) // the same instant
	if ans.bodyOf(same) == nil {
		t.Error("the same instant in another zone is another movement")
	}
	for _, other := range []app.Movement{
		{ID: "wd_2", Amount: 100, Status: app.Succeeded, CreatedAt: at},
		{ID: "wd_1", Amount: 100, Status: app.Pending, CreatedAt: at},
		{ID: "wd_1", Amount: 101, Status: app.Succeeded, CreatedAt: at},
		{ID: "wd_1", Amount: 100, Status: app.Succeeded, CreatedAt: at.Add(time.Second)},
	} {
		if ans.bodyOf(other) != nil {
			t.Errorf("the body stored for %+v answers %+v", m, other)
		}
	}
}

// plainAmount is amountRequest without membersDecoder: what Decode's decoder makes of a body.
type plainAmount struct {
	Amount json.RawMessage `json:"amount"`
}

// FuzzAmountDecode: a money request's body taken from Decode's own parse (membersDecoder) gives
// the same answer as the decoder: the same problem, or the same amount's bytes.
func FuzzAmountDecode(f *testing.F) {
	for _, s := range []string{
		`{"amount":"1.00"}`, `{"amount": 1.5 }`, ` {"amount" : "7" } `, `{"amount":null}`, `{}`,
		`{"amount":{"a":1}}`, `{"amount":[1,"2"]}`, `{"Amount":"1"}`, `{"amount":"1","x":2}`,
		`{"amount":"\u0000"}`, `{"amount":"\\U0000"}`, `{"amount":"\u00e9"}`, `[]`, `null`, `"x"`, ``,
		`{"amount":"1"}{}`, `{"amount":"1","amount":"2"}`, `{"amount":true}`, `{"amount":"1",}`,
		"{\"amount\":\"1\"}\n", `{"amount":-0.01e2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast amountRequest
		var slow plainAmount
		pf, ps := Decode(body, &fast), Decode(body, &slow)
		if (pf == nil) != (ps == nil) || pf != nil && (pf.Status != ps.Status || pf.Code != ps.Code || pf.Detail != ps.Detail) {
			t.Fatalf("Decode(%q): from the members %+v, by the decoder %+v", body, pf, ps)
		}
		if pf == nil && !bytes.Equal(fast.Amount, slow.Amount) || (fast.Amount == nil) != (slow.Amount == nil) {
			t.Fatalf("Decode(%q): amount from the members %q, by the decoder %q", body, fast.Amount, slow.Amount)
		}
	})
}

// TestDecodeUnknownMemberStable: of several unknown members Decode names the first in sorted
// order, every time (the map's order is random), and an empty name is one too.
func TestDecodeUnknownMemberStable(t *testing.T) {
	for body, want := range map[string]string{
		`{"zz":1,"amount":"1","b":2,"aa":3}`: `unknown member "aa"`,
		`{"":1,"amount":"1"}`:                `unknown member ""`,
	} {
		for range 20 {
			if p := Decode([]byte(body), &amountRequest{}); p == nil || p.Detail != want {
				t.Fatalf("Decode(%s) = %+v; want %q", body, p, want)
			}
		}
	}
}
