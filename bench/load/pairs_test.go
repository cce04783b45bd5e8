package main

import (
	"slices"
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
// B with build A in the same configuration, the default and SQLite also with the floor that does a
// part of their work (the minted floor, the grouped one), and nothing is
// paired with a reference that did not run.
func TestPairings(t *testing.T) {
	for _, c := range []struct {
		groups []string
		want   []pairing
	}{
		{[]string{groupPgbench, groupSQLite, groupPostgres, groupPostgresB, groupTokens, groupChain, groupFloor},
			[]pairing{{groupPostgres, groupFloor}, {groupPostgresB, groupPostgres}, {groupTokens, groupFloor}, {groupChain, groupFloor}}},
		{allGroups,
			[]pairing{{groupSQLite, groupFloorSQLite}, {groupSQLite, groupFloorGrouped}, {groupSQLiteB, groupSQLite}, {groupPostgres, groupFloor}, {groupPostgresB, groupPostgres},
				{groupTokens, groupFloor}, {groupTokens, groupFloorMinted}, {groupTokensB, groupTokens}, {groupChain, groupFloor}}},
		{[]string{groupTokens, groupTokensB, groupFloorMinted},
			[]pairing{{groupTokens, groupFloorMinted}, {groupTokensB, groupTokens}}},
	} {
		if got := pairings(c.groups); !slices.Equal(got, c.want) {
			t.Errorf("pairings(%v) = %v, want %v", c.groups, got, c.want)
		}
	}
}

// A service against a floor other than its own is informational: no
// verdict on its rate or its CPU.
func TestPairLinesInformational(t *testing.T) {
	rep := newReport(config{clients: []int{16}, pairs: 3, groups: []string{groupTokens, groupFloor, groupFloorMinted}})
	c := &pairCells{}
	for range 3 {
		c.group = append(c.group, &cellResult{ok: 400, window: time.Second, cpu: cpuUse{0.4, 0.4, 0.4, 0.4, cpuNA}})
		c.ref = append(c.ref, &cellResult{ok: 600, window: time.Second, cpu: cpuUse{0.4, 0.4, 0.4, 0.4, cpuNA}})
	}
	rep.pairs[pairKey(pairing{groupTokens, groupFloorMinted}, 16)] = c
	lines := rep.pairLines()
	if len(lines) != 1 {
		t.Fatalf("lines = %q, want one", lines)
	}
	if !strings.Contains(lines[0], "withdrawals/s 0.667×") || strings.Contains(lines[0], "PASS") || strings.Contains(lines[0], "FAIL") || strings.Contains(lines[0], "TIE") {
		t.Errorf("line = %q, want the ratio 0.667× and no verdict", lines[0])
	}
}

// A build B group named in -only needs -bin-b, one run needs its build A
// group, and -bin-b needs one run.
func TestCheckBuildB(t *testing.T) {
	for _, c := range []struct {
		only, groups []string
		binB         bool
		want         string // "" for no error, else a part of it
	}{
		{[]string{groupPostgres}, []string{groupPostgres, groupPostgresB}, false, ""}, // main drops postgres-b
		{[]string{groupPostgres}, []string{groupPostgres, groupPostgresB}, true, ""},
		{[]string{groupTokens}, []string{groupTokens, groupTokensB}, true, ""},
		{[]string{groupSQLite}, []string{groupSQLite, groupSQLiteB}, true, ""},
		{nil, allGroups, true, ""},
		{[]string{groupFloor}, []string{groupFloor}, true, "-bin-b runs beside"},
		{[]string{groupTokensB}, []string{groupTokensB}, true, "-only postgres-tokens-b runs beside the group postgres-tokens"},
		{[]string{groupPostgresB}, []string{groupPostgresB}, false, "-only postgres-b needs -bin-b"},
		{[]string{groupTokens, groupTokensB}, []string{groupTokens, groupTokensB}, false, "-only postgres-tokens-b needs -bin-b"},
	} {
		err := checkBuildB(c.only, c.groups, c.binB)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("checkBuildB(%v, %v, %v) = %v; want %q", c.only, c.groups, c.binB, err, c.want)
		}
	}
}
