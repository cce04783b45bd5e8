package main

import (
	"strings"
	"testing"
	"time"
)

// The table says which rows run with submit tokens off, and the default
// configuration (a token minted per withdrawal) has its own row.
func TestReportSubmitTokens(t *testing.T) {
	cfg := config{clients: []int{16}, groups: []string{groupPgbench, groupPostgres, groupTokens}}
	rep := newReport(cfg)
	cell := func(ok int) *cellResult {
		return &cellResult{ok: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: cpuUse{-1, -1, -1, -1}}
	}
	rep.add(groupPgbench, 16, cell(1000))
	rep.add(groupPostgres, 16, cell(600))
	rep.add(groupTokens, 16, cell(400))
	var b strings.Builder
	rep.print(&b, true)
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[0], "| submit tokens |") {
		t.Fatalf("header %q: want a submit tokens column", lines[0])
	}
	want := map[string]string{
		"| " + groupLabels[groupPostgres] + " | off | 16 | 600 |":                   "",
		"| " + groupLabels[groupTokens] + " | 1 minted per withdrawal | 16 | 400 |": "",
		"| " + groupLabels[groupPgbench] + " | - | 16 | 1000 tx/s |":                "",
	}
	for prefix := range want {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, prefix)
		}
		if !found {
			t.Errorf("no row starting %q in\n%s", prefix, b.String())
		}
	}
}
