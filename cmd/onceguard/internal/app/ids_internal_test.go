package app

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Ids carry their prefix and 28 hex digits, fit the schema's VARCHAR(32)
// with the longest prefix, differ within one millisecond and sort in the
// order they were made across milliseconds.
func TestNewIDOrderedAndUnique(t *testing.T) {
	form := regexp.MustCompile(`^dep_[0-9a-f]{28}$`)
	seen := map[string]bool{}
	var made []string
	for i := 0; i < 2000; i++ {
		id := newID("dep_")
		if !form.MatchString(id) || len(id) > 32 {
			t.Fatalf("newID = %q; want dep_ and 28 hex digits, at most 32 characters", id)
		}
		if seen[id] {
			t.Fatalf("newID made %q twice", id)
		}
		seen[id] = true
		if i%500 == 0 {
			made = append(made, id)
			time.Sleep(2 * time.Millisecond)
		}
	}
	if !slices.IsSorted(made) {
		t.Errorf("ids made milliseconds apart, in order %v, do not sort in that order", made)
	}
	before := time.Now().UnixMilli()
	id := newID("wd_")
	after := time.Now().UnixMilli()
	ms, err := strconv.ParseInt(id[3:15], 16, 64)
	if err != nil || ms < before || ms > after {
		t.Errorf("newID = %q: its first 12 hex digits are %d ms (%v); want the time it was made, in [%d, %d]", id, ms, err, before, after)
	}
}
