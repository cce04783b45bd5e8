package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The table says which rows run with submit tokens off, and the default
// configuration has its own rows: a token minted per withdrawal, and the
// tokens chained (each the answer before's offer), judged by the same
// target.
func TestReportSubmitTokens(t *testing.T) {
	cfg := config{clients: []int{16}, groups: []string{groupPgbench, groupPostgres, groupTokens, groupChain, groupFloor}}
	rep := newReport(cfg)
	cell := func(ok int) *cellResult {
		return &cellResult{ok: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: cpuUse{-1, -1, -1, -1}}
	}
	rep.add(groupPgbench, 16, cell(1000))
	rep.add(groupPostgres, 16, cell(600))
	rep.add(groupTokens, 16, cell(400))
	rep.add(groupChain, 16, cell(550))
	rep.add(groupFloor, 16, cell(1000))
	var b strings.Builder
	rep.print(&b, true)
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[0], "| submit tokens |") {
		t.Fatalf("header %q: want a submit tokens column", lines[0])
	}
	want := map[string]string{
		"| " + groupLabels[groupPostgres] + " | off | 16 | 600 |":                     "",
		"| " + groupLabels[groupTokens] + " | 1 minted per withdrawal | 16 | 400 |":   "",
		"| " + groupLabels[groupChain] + " | chained: the last answer's | 16 | 550 |": "",
		"| " + groupLabels[groupPgbench] + " | - | 16 | 1000 tx/s |":                  "",
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
	var chained []string
	for _, l := range rep.issue22Lines(nil) {
		if strings.HasPrefix(l, targetLabel(groupChain)) {
			chained = append(chained, l)
		}
	}
	if len(chained) != 1 || !strings.Contains(chained[0], "0.55× the floor's") || !strings.Contains(chained[0], "want ≥ 0.50×") {
		t.Errorf("issue 22 lines of the chained group = %q; want one, 0.55× the floor's against 0.50×", chained)
	}
}

// mdRow is the cells of the Markdown row that starts with label and the
// clients, by header.
func mdRow(t *testing.T, table, label string, clients int) map[string]string {
	t.Helper()
	lines := strings.Split(table, "\n")
	split := func(l string) []string {
		f := strings.Split(strings.Trim(l, "|"), " | ")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		return f
	}
	head := split(lines[0])
	for _, l := range lines[2:] {
		if !strings.HasPrefix(l, "| ") {
			break
		}
		f := split(l)
		if len(f) != len(head) {
			t.Fatalf("row %q has %d cells, the header %d", l, len(f), len(head))
		}
		row := map[string]string{}
		for i, h := range head {
			row[h] = f[i]
		}
		if row["configuration"] == label && row["clients"] == strconv.Itoa(clients) {
			return row
		}
	}
	t.Fatalf("no row %q, %d clients in\n%s", label, clients, table)
	return nil
}

// "vs floor" takes each service row against the floor on its own
// database: SQLite against the SQLite floor, PostgreSQL against the
// PostgreSQL floor; "vs ceiling" stays pgbench's for every row. "pg round
// trips" is the proxy's count per withdrawal that ended in the window.
func TestReportVsFloorAndRoundTrips(t *testing.T) {
	cfg := config{clients: []int{16, 64}, groups: []string{groupPgbench, groupSQLite, groupPostgres, groupTokens, groupFloor, groupFloorSQLite}}
	rep := newReport(cfg)
	cell := func(ok int, rt int64) *cellResult {
		c := &cellResult{ok: ok, ended: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: unknownCPU()}
		if rt > 0 {
			c.rt, c.rtOK = rt, true
		}
		return c
	}
	for _, n := range []int{16, 64} {
		rep.add(groupPgbench, n, cell(4000, 16000))
		rep.add(groupFloor, n, cell(2000, 8100))
		rep.add(groupFloorSQLite, n, cell(2500, 0))
		rep.add(groupPostgres, n, cell(500, 10000))
		rep.add(groupTokens, n, cell(400, 0))
	}
	rep.add(groupSQLite, 16, cell(1000, 0)) // at 64 clients the SQLite service has no floor's partner: it has no cell
	var b strings.Builder
	rep.print(&b, true)
	table := b.String()
	for _, c := range []struct {
		label                string
		clients              int
		vsCeil, vsFloor, rts string
	}{
		{groupLabels[groupPgbench], 16, "-", "-", "4.00"},
		{groupLabels[groupSQLite], 16, "0.25×", "0.40×", "-"},
		{groupLabels[groupPostgres], 16, "0.12×", "0.25×", "20.00"},
		{groupLabels[groupTokens], 64, "0.10×", "0.20×", "-"},
		{groupLabels[groupFloor], 64, "0.50×", "-", "4.05"},
		{groupLabels[groupFloorSQLite], 64, "0.62×", "-", "-"},
	} {
		row := mdRow(t, table, c.label, c.clients)
		if row["vs ceiling"] != c.vsCeil || row["vs floor"] != c.vsFloor || row["pg round trips"] != c.rts {
			t.Errorf("%s, %d clients: vs ceiling %q, vs floor %q, pg round trips %q; want %q, %q, %q",
				c.label, c.clients, row["vs ceiling"], row["vs floor"], row["pg round trips"], c.vsCeil, c.vsFloor, c.rts)
		}
	}

	// Without its floor in the run, a service row has no "vs floor".
	rep = newReport(config{clients: []int{16}, groups: []string{groupSQLite, groupPostgres}})
	rep.add(groupSQLite, 16, cell(1000, 0))
	rep.add(groupPostgres, 16, cell(500, 0))
	b.Reset()
	rep.print(&b, true)
	for _, g := range []string{groupSQLite, groupPostgres} {
		if row := mdRow(t, b.String(), groupLabels[g], 16); row["vs floor"] != "-" || row["vs ceiling"] != "-" {
			t.Errorf("%s without floor and ceiling: vs floor %q, vs ceiling %q, want - and -", g, row["vs floor"], row["vs ceiling"])
		}
	}
}

// tcell is a synthetic cell: ok withdrawals in one second, and the CPU of
// the service, postgres, Redis and the client in cores (cpuNA: does not
// apply, -1: unknown).
func tcell(ok int, svc, pg, redis, load float64) *cellResult {
	c := &cellResult{ok: ok, ended: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: unknownCPU()}
	c.cpu[cpuSvc], c.cpu[cpuPG], c.cpu[cpuRedis], c.cpu[cpuLoad] = svc, pg, redis, load
	return c
}

// Issue 22's targets: each line's verdict (PASS, FAIL, or TIE when the
// rounds fall on both sides), its per-round figures, and no line for
// what cannot be computed.
func TestIssue22Targets(t *testing.T) {
	const na = cpuNA
	// The floors, the same every case: PostgreSQL 2000/s at 0.8 cores
	// (0.40 ms per withdrawal), SQLite 2000/s at 0.8 cores.
	pgFloor := func() *cellResult { return tcell(2000, 0.3, 0.3, na, 0.2) }
	sqFloor := func() *cellResult { return tcell(2000, 0.6, na, na, 0.2) }
	type line struct {
		g       string
		clients int    // 0: the per-round commits line
		metric  string // "withdrawals/s", "CPU per withdrawal", "commits"
		tail    string // from the value on
	}
	for _, c := range []struct {
		name    string
		groups  []string
		cells   map[string][]*cellResult // group -> rounds, at 16 clients
		commits map[string][]float64
		want    []line
	}{{
		name:   "pass",
		groups: []string{groupPostgres, groupFloor},
		cells: map[string][]*cellResult{
			groupPostgres: {tcell(1300, 0.5, 0.3, 0.1, 0.1), tcell(1300, 0.5, 0.3, 0.1, 0.1)}, // 0.77 ms
			groupFloor:    {pgFloor(), pgFloor()},
		},
		commits: map[string][]float64{groupPostgres: {1.5, 1.8}},
		want: []line{
			{groupPostgres, 16, "withdrawals/s", "0.65× the floor's (1300/s vs 2000/s, want ≥ 0.60×)  PASS  per round: 0.65 0.65"},
			{groupPostgres, 16, "CPU per withdrawal", "1.92× the floor's (0.77 ms vs 0.40 ms, want ≤ 2.50×)  PASS  per round: 1.92 1.92"},
			{groupPostgres, 0, "commits", "1.65 (want ≤ 2.00)  PASS  per round: 1.50 1.80"},
		},
	}, {
		name:   "fail",
		groups: []string{groupTokens, groupFloor},
		cells: map[string][]*cellResult{
			groupTokens: {tcell(800, 0.8, 0.5, 0.1, 0.2), tcell(800, 0.8, 0.5, 0.1, 0.2)}, // 2 ms
			groupFloor:  {pgFloor(), pgFloor()},
		},
		commits: map[string][]float64{groupPostgres: {2.5, 2.2}},
		want: []line{
			{groupTokens, 16, "withdrawals/s", "0.40× the floor's (800/s vs 2000/s, want ≥ 0.50×)  FAIL  per round: 0.40 0.40"},
			{groupTokens, 16, "CPU per withdrawal", "5.00× the floor's (2.00 ms vs 0.40 ms, want ≤ 2.50×)  FAIL  per round: 5.00 5.00"},
			{groupPostgres, 0, "commits", "2.35 (want ≤ 2.00)  no verdict: an upper bound over the target  per round: 2.50 2.20"},
		},
	}, {
		name:   "tie",
		groups: []string{groupSQLite, groupFloorSQLite, groupFloorGrouped},
		cells: map[string][]*cellResult{
			// 0.55 and 0.45 of the floor; 0.80 ms and 1.20 ms: 2× and 3× its 0.40 ms.
			groupSQLite:      {tcell(1100, 0.68, na, na, 0.2), tcell(900, 0.88, na, na, 0.2)},
			groupFloorSQLite: {sqFloor(), sqFloor()},
			// Twice the floor's rate: 0.275 and 0.225 of it.
			groupFloorGrouped: {tcell(4000, 0.2, na, na, 0.2), tcell(4000, 0.2, na, na, 0.2)},
		},
		commits: map[string][]float64{groupPostgres: {1.9, 2.1}, groupSQLite: {5, 5}},
		want: []line{
			{groupSQLite, 16, "withdrawals/s", "0.50× the floor's (1000/s vs 2000/s, want ≥ 0.50×)  TIE  per round: 0.55 0.45"},
			{groupSQLite, 16, "withdrawals/s", "0.25× the grouped floor's (1000/s vs 4000/s, want ≥ 0.50×)  FAIL  per round: 0.28 0.23"},
			{groupSQLite, 16, "CPU per withdrawal", "2.50× the floor's (1.00 ms vs 0.40 ms, want ≤ 2.50×)  TIE  per round: 2.00 3.00"},
			{groupPostgres, 0, "commits", "2.00 (want ≤ 2.00)  no verdict: an upper bound over the target  per round: 1.90 2.10"},
		},
	}, {
		// No floor for PostgreSQL; the SQLite service's CPU unknown; a
		// round of the floor that did not run; no commit figures.
		name:   "skipped",
		groups: []string{groupPostgres, groupTokens, groupSQLite, groupFloorSQLite},
		cells: map[string][]*cellResult{
			groupPostgres:    {tcell(1300, 0.5, 0.3, 0.1, 0.1)},
			groupTokens:      {tcell(800, 0.8, 0.5, 0.1, 0.2)},
			groupSQLite:      {tcell(1200, -1, na, na, 0.2), tcell(1200, -1, na, na, 0.2)},
			groupFloorSQLite: {{err: "did not start", cpu: unknownCPU()}, sqFloor()},
		},
		want: []line{
			{groupSQLite, 16, "withdrawals/s", "0.60× the floor's (1200/s vs 2000/s, want ≥ 0.50×)  PASS  per round: 0.60"},
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			rep := newReport(config{clients: []int{16, 64}, groups: c.groups})
			for g, rs := range c.cells {
				for _, r := range rs {
					rep.add(g, 16, r)
				}
			}
			lines := rep.issue22Lines(c.commits)
			for _, w := range c.want {
				prefix := fmt.Sprintf("%-55s %3d clients  %s ", targetLabel(w.g), w.clients, w.metric)
				if w.clients == 0 {
					prefix = fmt.Sprintf("%-55s  per round   commits per withdrawal ", targetLabel(w.g))
				}
				found := false
				var got []string
				for _, l := range lines {
					if strings.HasPrefix(l, prefix) {
						got = append(got, strings.TrimPrefix(l, prefix))
						found = found || strings.TrimPrefix(l, prefix) == w.tail
					}
				}
				if !found {
					t.Errorf("%s:\n got %q\nwant %q among them, in\n%s", prefix, got, w.tail, strings.Join(lines, "\n"))
				}
			}
			if len(lines) != len(c.want) {
				t.Errorf("%d lines, want %d:\n%s", len(lines), len(c.want), strings.Join(lines, "\n"))
			}
			var b strings.Builder
			rep.printTargets22(&b, c.commits)
			if got := strings.HasPrefix(b.String(), "\nissue 22 targets"); got != (len(c.want) > 0) {
				t.Errorf("block printed %v with %d lines:\n%s", got, len(c.want), b.String())
			}
		})
	}

	// Nothing to compute: no block at all.
	var b strings.Builder
	newReport(config{clients: []int{16}, groups: []string{groupPostgres}}).printTargets22(&b, nil)
	if b.Len() != 0 {
		t.Errorf("without floors or commits: %q, want nothing", b.String())
	}
}

// The commits target reads the figure its database-work line prints.
func TestNoteCommits(t *testing.T) {
	note := fmt.Sprintf("round %d: %s%s", 2, pgWork(dbStats{commits: 100, ok: true}, dbStats{commits: 330, ok: true}, proxyCounts{}, proxyCounts{}, 100), " per withdrawal sent (…)")
	if x, ok := noteCommits(note); !ok || x != 2.3 {
		t.Errorf("noteCommits(%q) = %v, %v; want 2.3, true", note, x, ok)
	}
	if _, ok := noteCommits("round 1: commits not measured (no readable wal-index x-shm)"); ok {
		t.Error("a round without commits gave a figure")
	}
	svcs := []*serviceConfig{{group: groupPostgres, workNotes: []string{note, "round 3: 1.75 commits, 0.00 rollbacks"}}}
	if got := roundCommits(svcs)[groupPostgres]; len(got) != 2 || got[0] != 2.3 || got[1] != 1.75 {
		t.Errorf("roundCommits = %v, want [2.3 1.75]", got)
	}
}

// The table's cpu/wd: all processes' CPU per withdrawal, median over
// rounds; "?" when a figure that applies is unknown.
func TestReportCPUPerWd(t *testing.T) {
	rep := newReport(config{clients: []int{16}, groups: []string{groupPostgres, groupFloor}})
	rep.add(groupPostgres, 16, tcell(1000, 0.5, 0.3, 0.1, 0.1)) // 1 ms
	rep.add(groupPostgres, 16, tcell(1000, 0.7, 0.3, 0.1, 0.1)) // 1.2 ms
	rep.add(groupFloor, 16, tcell(2000, 0.3, -1, cpuNA, 0.2))
	var b strings.Builder
	rep.print(&b, true)
	if got := mdRow(t, b.String(), groupLabels[groupPostgres], 16)["cpu/wd"]; got != "1.10ms" {
		t.Errorf("postgres cpu/wd %q, want 1.10ms", got)
	}
	if got := mdRow(t, b.String(), groupLabels[groupFloor], 16)["cpu/wd"]; got != "?" {
		t.Errorf("floor cpu/wd with postgres unknown %q, want ?", got)
	}
}

// Write transactions per withdrawal: the table's "pg write txs" and
// issue 22's durable-commits line, PASS at 2.00 and FAIL above, no line
// for a cell without the count.
func TestReportWriteTxs(t *testing.T) {
	rep := newReport(config{clients: []int{16, 64}, groups: []string{groupPostgres}})
	cell := func(ok int, wtx int64) *cellResult {
		c := &cellResult{ok: ok, ended: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: unknownCPU()}
		if wtx >= 0 {
			c.wtx, c.wtxOK = wtx, true
		}
		return c
	}
	rep.add(groupPostgres, 16, cell(500, 1000))
	rep.add(groupPostgres, 64, cell(500, 1500))
	rep.add(groupPostgres, 64, cell(500, -1)) // a round without the count: the median of those with it
	var b strings.Builder
	rep.print(&b, true)
	out := b.String()
	if row := mdRow(t, out, groupLabels[groupPostgres], 16); row["pg write txs"] != "2.00" {
		t.Errorf("16 clients: pg write txs %q; want 2.00", row["pg write txs"])
	}
	if row := mdRow(t, out, groupLabels[groupPostgres], 64); row["pg write txs"] != "3.00" {
		t.Errorf("64 clients: pg write txs %q; want 3.00", row["pg write txs"])
	}
	lines := rep.issue22Lines(nil)
	var got []string
	for _, l := range lines {
		if strings.Contains(l, "durable commits") {
			got = append(got, l)
		}
	}
	if len(got) != 2 || !strings.Contains(got[0], " 16 clients") || !strings.Contains(got[0], "2.00 (want ≤ 2.00)  PASS") ||
		!strings.Contains(got[1], "3.00 (want ≤ 2.00)  FAIL") {
		t.Errorf("durable-commit lines = %q; want 16 clients 2.00 PASS, 64 clients 3.00 FAIL", got)
	}
}

// Build B's row sits under build A's, and the A/B lines pair the two by
// round: a side is ahead only when it is in every round.
func TestReportAB(t *testing.T) {
	for _, c := range []struct {
		a, b []int
		want string
	}{
		{[]int{1000, 1000, 1000}, []int{1100, 1200, 1050}, "withdrawals/s B/A 1.10× (1100/s vs 1000/s)  B ahead in every round  per round: 1.10 1.20 1.05"},
		{[]int{1000, 1000, 1000}, []int{900, 950, 990}, "A ahead in every round  per round: 0.90 0.95 0.99"},
		{[]int{1000, 1000, 1000}, []int{1100, 900, 1200}, "not resolved (B ahead in 2 of 3 rounds)  per round: 1.10 0.90 1.20"},
	} {
		rep := newReport(config{clients: []int{16}, groups: []string{groupPostgres, groupPostgresB}})
		cell := func(ok int) *cellResult {
			return &cellResult{ok: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: cpuUse{-1, -1, -1, -1}}
		}
		for i := range c.a {
			rep.add(groupPostgres, 16, cell(c.a[i]))
			rep.add(groupPostgresB, 16, cell(c.b[i]))
		}
		lines := rep.abLines()
		if len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("A %v, B %v: lines %q; want one containing %q", c.a, c.b, lines, c.want)
		}
		var b strings.Builder
		rep.print(&b, true)
		if row := mdRow(t, b.String(), groupLabels[groupPostgresB], 16); row["submit tokens"] != "off" || row["vs floor"] != "-" {
			t.Errorf("build B's row %v: want tokens off, no floor in the run", row)
		}
	}
	if lines := newReport(config{clients: []int{16}, groups: []string{groupPostgres}}).abLines(); len(lines) != 0 {
		t.Errorf("without build B: %q; want no A/B line", lines)
	}
}

// Build B in each configuration (SQLite, tokens off, the default) is
// compared with build A in it, on a line of its own, and its default row
// says a token is minted per withdrawal.
func TestReportABDefault(t *testing.T) {
	rep := newReport(config{clients: []int{16}, groups: []string{groupSQLite, groupSQLiteB, groupPostgres, groupPostgresB, groupTokens, groupTokensB}})
	cell := func(ok int) *cellResult {
		return &cellResult{ok: ok, window: time.Second, lat: []time.Duration{time.Millisecond}, cpu: cpuUse{-1, -1, -1, -1}}
	}
	for range 2 {
		rep.add(groupSQLite, 16, cell(2000))
		rep.add(groupSQLiteB, 16, cell(2200))
		rep.add(groupPostgres, 16, cell(1000))
		rep.add(groupPostgresB, 16, cell(900))
		rep.add(groupTokens, 16, cell(500))
		rep.add(groupTokensB, 16, cell(600))
	}
	lines := rep.abLines()
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SQLite:") || !strings.Contains(lines[0], "B/A 1.10× (2200/s vs 2000/s)  B ahead") ||
		!strings.HasPrefix(lines[1], "tokens off:") || !strings.Contains(lines[1], "B/A 0.90× (900/s vs 1000/s)  A ahead") ||
		!strings.HasPrefix(lines[2], "default:") || !strings.Contains(lines[2], "B/A 1.20× (600/s vs 500/s)  B ahead") {
		t.Errorf("lines %q; want SQLite 1.10× B ahead, tokens off 0.90× A ahead, then default 1.20× B ahead", lines)
	}
	var b strings.Builder
	rep.print(&b, true)
	if row := mdRow(t, b.String(), groupLabels[groupTokensB], 16); row["submit tokens"] != "1 minted per withdrawal" {
		t.Errorf("build B's default row %v: want a token minted per withdrawal", row)
	}
}
