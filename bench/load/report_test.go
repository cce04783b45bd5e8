package main

import (
	"strconv"
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
