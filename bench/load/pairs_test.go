package main

import (
	"strings"
	"testing"
	"time"
)

// The paired blocks are judged from their interval: a contender steadily
// at 0.62× of its floor passes 0.6× though one pair of its blocks is
// below; one that swings 0.5–0.7× is a tie; build B is compared with build
// A without a target; a contender without its reference is left out.
func TestPairLines(t *testing.T) {
	cfg := config{clients: []int{16}, pairs: 4, groups: []string{groupPostgres, groupPostgresB, groupTokens, groupSQLite, groupFloor}}
	rep := newReport(cfg)
	// cell: ok withdrawals in one second, with the service, postgres,
	// Redis and client each busy cpu cores.
	cell := func(ok int, cpu float64) *cellResult {
		return &cellResult{ok: ok, window: time.Second, cpu: cpuUse{cpu, cpu, cpu, cpu, cpuNA}}
	}
	add := func(g, ref string, rates []int, refRates []int) {
		c := &pairCells{}
		for i := range rates {
			// The same CPU in both blocks: per withdrawal, the ratio of rates inverted.
			c.group = append(c.group, cell(rates[i], 0.4))
			c.ref = append(c.ref, cell(refRates[i], 0.4))
		}
		rep.pairs[pairKey(pairing{g, ref}, 16)] = c
	}
	add(groupPostgres, groupFloor, []int{620, 310, 640, 590}, []int{1000, 500, 1000, 960})   // 0.62, 0.62, 0.64, 0.61: geometric mean 0.624, t(3) interval 0.606–0.642
	add(groupTokens, groupFloor, []int{500, 700, 500, 700}, []int{1000, 1000, 1000, 1000})   // 0.5, 0.7
	add(groupPostgresB, groupPostgres, []int{660, 650, 700, 640}, []int{600, 600, 600, 600}) // B ahead
	lines := rep.pairLines()
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (postgres, build B, default; no SQLite floor, so no SQLite line):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, c := range []struct{ label, want string }{
		{groupLabels[groupPostgres] + " / " + groupLabels[groupFloor], "withdrawals/s 0.624× (95% CI 0.606–0.642, 4 pairs) ≥ 0.6× PASS; CPU per withdrawal 1.60× (95% CI 1.56–1.65) ≤ 2.5× PASS"},
		{groupLabels[groupTokens] + " / " + groupLabels[groupFloor], "≥ 0.5× TIE"},
		{groupLabels[groupPostgresB] + " / " + groupLabels[groupPostgres], "withdrawals/s 1.104× (95% CI 1.037–1.174, 4 pairs); CPU per withdrawal 0.91×"},
	} {
		var got string
		for _, l := range lines {
			if strings.HasPrefix(l, c.label+" ") {
				got = l
			}
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("line of %s = %q; want it to contain %q", c.label, got, c.want)
		}
	}
	for _, l := range lines {
		if strings.HasPrefix(l, groupLabels[groupPostgresB]) && strings.Contains(l, "PASS") {
			t.Errorf("build B has no target, got %q", l)
		}
	}
}

// Each service contender is paired with the floor on its database, build
// B with build A, and nothing is paired with a reference that did not run.
func TestPairings(t *testing.T) {
	got := pairings([]string{groupPgbench, groupSQLite, groupPostgres, groupPostgresB, groupTokens, groupChain, groupFloor})
	want := []pairing{{groupPostgres, groupFloor}, {groupPostgresB, groupPostgres}, {groupTokens, groupFloor}, {groupChain, groupFloor}}
	if len(got) != len(want) {
		t.Fatalf("pairings = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pairings = %v, want %v", got, want)
		}
	}
}
