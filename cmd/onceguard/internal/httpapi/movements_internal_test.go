package httpapi

import (
	"bytes"
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
