package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// target: the service's withdrawals/s against pgbench's transactions/s at
// the same number of clients.
const target = 0.5

type report struct {
	cfg         config
	cells       map[string][]*cellResult // "group/clients" -> one per round
	pairs       map[string]*pairCells    // pairKey -> the paired blocks (-pairs)
	interrupted bool
}

func newReport(cfg config) *report {
	return &report{cfg: cfg, cells: map[string][]*cellResult{}, pairs: map[string]*pairCells{}}
}

func cellKey(g string, n int) string { return fmt.Sprintf("%s/%d", g, n) }

func (r *report) add(g string, n int, res *cellResult) {
	r.cells[cellKey(g, n)] = append(r.cells[cellKey(g, n)], res)
}

// summary is the median over rounds of each metric of a cell, separately.
type summary struct {
	rounds   int
	rate     float64
	p50, p99 time.Duration
	cpu      cpuUse
	spread   float64
	rt       float64 // PostgreSQL round trips per withdrawal (pgbench: transaction); NaN unknown
	wtx      float64 // PostgreSQL write transactions per withdrawal (transaction ids taken); NaN unknown
	nonOK    int
	merged   *cellResult // non-OK answers of all rounds together
	errs     []string
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func (r *report) summarize(g string, n int) (summary, bool) {
	rs := r.cells[cellKey(g, n)]
	s := summary{merged: &cellResult{other: map[string]int{}, otherSample: map[string]string{}, notSucceeded: map[string]int{}}}
	var rates, p50, p99, rts, wtxs []float64
	var cpus [cpuN][]float64
	na := [cpuN]bool{}
	for _, c := range rs {
		if c.err != "" {
			s.errs = append(s.errs, c.err)
		}
		s.nonOK += c.nonOK()
		s.merged.transport += c.transport
		s.merged.failed += c.failed
		for k, v := range c.other {
			s.merged.other[k] += v
			if _, ok := s.merged.otherSample[k]; !ok {
				s.merged.otherSample[k] = c.otherSample[k]
			}
		}
		for k, v := range c.notSucceeded {
			s.merged.notSucceeded[k] += v
		}
		if s.merged.firstErr == "" {
			s.merged.firstErr = c.firstErr
		}
		if c.ok == 0 && c.err != "" {
			continue // the cell did not run
		}
		s.rounds++
		rates = append(rates, c.rate())
		p50 = append(p50, float64(percentile(c.lat, 0.50)))
		p99 = append(p99, float64(percentile(c.lat, 0.99)))
		if rt, ok := c.roundTripsPer(); ok {
			rts = append(rts, rt)
		}
		if w, ok := c.writeTxsPer(); ok {
			wtxs = append(wtxs, w)
		}
		for i, v := range c.cpu {
			if v == cpuNA {
				na[i] = true
			} else if v >= 0 {
				cpus[i] = append(cpus[i], v)
			}
		}
	}
	if len(rs) == 0 {
		return s, false
	}
	for i := range s.cpu {
		switch {
		case na[i]:
			s.cpu[i] = cpuNA
		case len(cpus[i]) == 0:
			s.cpu[i] = -1
		default:
			s.cpu[i] = median(cpus[i])
		}
	}
	s.rt = median(rts) // NaN without any
	s.wtx = median(wtxs)
	if s.rounds > 0 {
		s.rate = median(rates)
		s.p50, s.p99 = time.Duration(median(p50)), time.Duration(median(p99))
		if s.rate > 0 {
			s.spread = (slices.Max(rates) - slices.Min(rates)) / s.rate
		}
	}
	return s, true
}

func (r *report) sortedClients() []int {
	c := slices.Clone(r.cfg.clients)
	slices.Sort(c)
	return c
}

// tableGroups is the row order within a client count: the ceiling first.
func (r *report) tableGroups() []string {
	var gs []string
	for _, g := range allGroups {
		if slices.Contains(r.cfg.groups, g) {
			gs = append(gs, g)
		}
	}
	return gs
}

func (r *report) print(out io.Writer, markdown bool) {
	head := []string{"configuration", "submit tokens", "clients", "withdrawals/s", "p50", "p99", "vs ceiling", "vs floor", "pg round trips", "pg write txs", "service cpu", "postgres cpu", "redis cpu", "client cpu", "cpu/wd", "spread", "not 201"}
	right := []bool{false, false, true, true, true, true, true, true, true, true, true, true, true, true, true, true, false}
	var rows [][]string
	for _, n := range r.sortedClients() {
		ceil, hasCeil := r.summarize(groupPgbench, n)
		for _, g := range r.tableGroups() {
			s, ok := r.summarize(g, n)
			if !ok {
				continue
			}
			rate, vs, vsFloor, nonOK := "-", "-", "-", fmt.Sprint(s.nonOK)
			if s.rounds > 0 {
				rate = fmt.Sprintf("%.0f", s.rate)
				if g == groupPgbench {
					rate += " tx/s"
				} else if hasCeil && ceil.rounds > 0 && ceil.rate > 0 {
					vs = fmt.Sprintf("%.2f×", s.rate/ceil.rate)
				}
				if fl := floorOf(g); fl != "" {
					if f, ok := r.summarize(fl, n); ok && f.rounds > 0 && f.rate > 0 {
						vsFloor = fmt.Sprintf("%.2f×", s.rate/f.rate)
					}
				}
			} else {
				rate = "error"
			}
			rt, wtx := "-", "-"
			if !math.IsNaN(s.rt) {
				rt = fmt.Sprintf("%.2f", s.rt)
			}
			if !math.IsNaN(s.wtx) {
				wtx = fmt.Sprintf("%.2f", s.wtx)
			}
			cpuWd := "?"
			if x, ok := r.cpuPerWd(g, n); ok {
				cpuWd = fmt.Sprintf("%.2fms", x)
			}
			if s.nonOK > 0 {
				nonOK += " (" + s.merged.nonOKSummary() + ")"
			}
			if g == groupPgbench {
				nonOK = fmt.Sprintf("%d failed tx", s.merged.failed)
				if s.merged.failed == 0 {
					nonOK = "0"
				}
			}
			rows = append(rows, []string{groupLabels[g], submitTokens(g), fmt.Sprint(n), rate, fmtDur(s.p50), fmtDur(s.p99), vs, vsFloor, rt, wtx,
				fmtCPU(s.cpu[cpuSvc]), fmtCPU(s.cpu[cpuPG]), fmtCPU(s.cpu[cpuRedis]), fmtCPU(s.cpu[cpuLoad]), cpuWd,
				fmt.Sprintf("%.0f%%", 100*s.spread), nonOK})
		}
	}
	if markdown {
		fmt.Fprintln(out, "| "+strings.Join(head, " | ")+" |")
		var seps []string
		for _, rt := range right {
			if rt {
				seps = append(seps, "---:")
			} else {
				seps = append(seps, "---")
			}
		}
		fmt.Fprintln(out, "| "+strings.Join(seps, " | ")+" |")
		for _, row := range rows {
			fmt.Fprintln(out, "| "+strings.Join(row, " | ")+" |")
		}
	} else {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
		for _, row := range rows {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "withdrawals/s: 201 answers to POST /api/v1/withdrawals per second of the measured window (requests that started and ended in it);")
	fmt.Fprintln(out, "ceiling rows: pgbench transactions/s of the one-row-update script, same window rule, from its per-transaction log;")
	if slices.ContainsFunc(r.cfg.groups, func(g string) bool { return strings.HasPrefix(g, "floor") }) {
		fmt.Fprintln(out, "floor rows: the same transaction behind POST /api/v1/withdrawals in a minimal Go server (no session, key, window, lock, provider or logs):")
		fmt.Fprintln(out, "on PostgreSQL with pgx, 20 connections; on SQLite with modernc.org/sqlite opened as the service opens it (WAL, synchronous=NORMAL, busy_timeout 10s, BEGIN IMMEDIATE,")
		fmt.Fprintln(out, "four connections, write transactions queued in Go by a sqldb.WriteGate), each withdrawal committed alone; \"grouped commits\": the queued ones committed together, as the service's;")
		fmt.Fprintln(out, "\"a token minted per withdrawal\": the PostgreSQL floor, each withdrawal first POSTing /api/v1/submit-tokens there (the session read, a row by its key, and a token signed")
		fmt.Fprintln(out, "as the service signs its own), its key that token, checked by its signature: the least the default's minted withdrawal costs; its vs floor is against the floor;")
	}
	fmt.Fprintln(out, "submit tokens: off: --require-submit-token \"\", each withdrawal carries a fresh plain key; 1 minted per withdrawal: the service's default")
	fmt.Fprintln(out, "(withdrawals need a submit token), each withdrawal first POSTs /api/v1/submit-tokens and its time includes that request; chained: the same default,")
	fmt.Fprintln(out, "each withdrawal's token the one the answer before offered (Next-Submit-Token, minted in that answer), as the web page does; a mint only when none was;")
	fmt.Fprintln(out, "p50/p99: latency of those; vs ceiling: withdrawals/s / pgbench tx/s at the same clients (SQLite rows: against PostgreSQL's ceiling);")
	fmt.Fprintln(out, "vs floor: withdrawals/s / the floor's on the same database at the same clients (SQLite service: the SQLite floor; PostgreSQL services: the PostgreSQL floor);")
	fmt.Fprintln(out, "pg write txs: transactions that wrote, which bound the durable commits from above (the service's settlement of a paid withdrawal is one that does not wait for its flush,")
	fmt.Fprintln(out, "unless --durable-settlements), from PostgreSQL's next transaction id at the window's edges (a read-only transaction takes none;")
	fmt.Fprintln(out, "cluster-wide, so anything else writing to the server counts too) per withdrawal (pgbench: transaction) that ended in the window;")
	fmt.Fprintln(out, "pg round trips: client→PostgreSQL round trips (Sync + Query messages, counted by the contender's proxy) in the window per withdrawal (pgbench: transaction) in it;")
	fmt.Fprintln(out, "cpu columns: CPU time over the window in % of one core: the service process; all postgres processes on the machine; Redis (INFO cpu);")
	fmt.Fprintln(out, "the client (this process, or pgbench); '-' does not apply. cpu/wd: ms of CPU per withdrawal (pgbench: transaction), those four together")
	fmt.Fprintln(out, "(those that apply) over the window / withdrawals/s, median over rounds; '?' unknown. spread: (max-min)/median of the rate over rounds;")
	fmt.Fprintln(out, "not 201: every other answer over all rounds, warm-up included (pgbench: failed transactions).")
}

// submitTokens says how a group's withdrawals get their keys.
func submitTokens(g string) string {
	switch g {
	case groupSQLite, groupSQLiteB, groupPostgres, groupPostgresB:
		return "off"
	case groupTokens, groupTokensB, groupFloorMinted:
		return "1 minted per withdrawal"
	case groupChain:
		return "chained: the last answer's"
	default:
		return "-"
	}
}

func (r *report) printTargets(out io.Writer) {
	if !slices.Contains(r.cfg.groups, groupPgbench) {
		return
	}
	fmt.Fprintf(out, "\ntarget: withdrawals/s at least %.0f%% of pgbench's tx/s at the same clients (medians; per round: that round's pair)\n", 100*target)
	for _, n := range r.sortedClients() {
		ceil, ok := r.summarize(groupPgbench, n)
		if !ok || ceil.rounds == 0 || ceil.rate <= 0 {
			continue
		}
		for _, g := range []string{groupPostgres, groupTokens, groupChain, groupSQLite, groupFloor, groupFloorMinted, groupFloorSQLite, groupFloorGrouped} {
			s, ok := r.summarize(g, n)
			if !ok || s.rounds == 0 {
				continue
			}
			ratio := s.rate / ceil.rate
			verdict := "PASS"
			if ratio < target {
				verdict = "FAIL"
			}
			var per []string
			svc, pgb := r.cells[cellKey(g, n)], r.cells[cellKey(groupPgbench, n)]
			for i := range min(len(svc), len(pgb)) {
				if pgb[i].rate() > 0 {
					per = append(per, fmt.Sprintf("%.2f", svc[i].rate()/pgb[i].rate()))
				}
			}
			note := ""
			switch g {
			case groupSQLite:
				note = " (another database's ceiling: informational)"
			case groupFloor:
				note = " (not a service: the least a withdrawal over HTTP costs here; informational)"
			case groupFloorMinted:
				note = " (not a service: the least a minted withdrawal over HTTP costs here; informational)"
			case groupFloorSQLite, groupFloorGrouped:
				note = " (not a service, and another database's ceiling: informational)"
			}
			label := groupLabels[g]
			if st := submitTokens(g); st != "-" {
				label += " (submit tokens " + st + ")"
			}
			fmt.Fprintf(out, "  %-55s %3d clients  %.2f× (%.0f/s vs %.0f tx/s, want ≥ %.2f×)  %s  per round: %s%s\n",
				label, n, ratio, s.rate, ceil.rate, target, verdict, strings.Join(per, " "), note)
		}
	}
}

// printNotes lists everything that was not a plain success, with
// evidence.
func (r *report) printNotes(out io.Writer, services []*serviceConfig, ceilingWork []string) {
	var notes []string
	for _, n := range r.sortedClients() {
		for _, g := range r.tableGroups() {
			s, ok := r.summarize(g, n)
			if !ok {
				continue
			}
			where := fmt.Sprintf("%s, %d clients", groupLabels[g], n)
			for _, e := range s.errs {
				notes = append(notes, where+": "+e)
			}
			if g == groupPgbench {
				if s.merged.failed > 0 {
					notes = append(notes, fmt.Sprintf("%s: %d failed transactions", where, s.merged.failed))
				}
				continue
			}
			keys := make([]string, 0, len(s.merged.other))
			for k := range s.merged.other {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				notes = append(notes, fmt.Sprintf("%s: %d × %s, e.g. %s", where, s.merged.other[k], k, s.merged.otherSample[k]))
			}
			for k, v := range s.merged.notSucceeded {
				notes = append(notes, fmt.Sprintf("%s: %d × 201 with status %q", where, v, k))
			}
			if s.merged.transport > 0 {
				notes = append(notes, fmt.Sprintf("%s: %d requests without an answer, first: %s", where, s.merged.transport, s.merged.firstErr))
			}
		}
	}
	for _, svc := range services {
		for _, n := range svc.notes {
			notes = append(notes, groupLabels[svc.group]+": "+n)
		}
		if lines := svc.logLines(); len(lines) > 0 {
			notes = append(notes, fmt.Sprintf("%s: the service wrote %d line(s) besides its start line; the first ones:", groupLabels[svc.group], len(lines)))
			for _, l := range lines[:min(len(lines), 20)] {
				notes = append(notes, "    "+truncate(l, 300))
			}
		}
	}
	var work []string
	for _, w := range ceilingWork {
		work = append(work, groupLabels[groupPgbench]+", "+w)
	}
	for _, svc := range services {
		for _, n := range svc.workNotes {
			work = append(work, groupLabels[svc.group]+", "+n)
		}
	}
	if len(work) > 0 {
		fmt.Fprintln(out, "\ndatabase work per round (PostgreSQL: pg_stat_database of the contender's database, read after its round's processes exited, and the round trips its proxy counted;")
		fmt.Fprintln(out, "SQLite: write transactions committed, from the database's WAL-index change counter read after start and before stop; no row or rollback counters):")
		for _, w := range work {
			fmt.Fprintln(out, "  "+w)
		}
	}
	fmt.Fprintln(out)
	if r.interrupted {
		notes = append(notes, "the run was interrupted: cells and balance checks after the signal did not run")
	}
	if len(notes) == 0 {
		fmt.Fprintln(out, "anomalies: none (every withdrawal answered 201 succeeded, every balance matched the answers, the service logged nothing and exited 0 on SIGTERM)")
		return
	}
	fmt.Fprintln(out, "anomalies:")
	for _, n := range notes {
		fmt.Fprintln(out, "  "+n)
	}
}

// Issue 22's targets, against the floors (and a commit budget).
const (
	targetPGFloor     = 0.6 // PostgreSQL + Redis, tokens off: withdrawals/s ≥ 0.6× the PostgreSQL floor's
	targetTokensFloor = 0.5 // PostgreSQL + Redis, default (a token minted per withdrawal): ≥ 0.5× it
	targetSQLiteFloor = 0.5 // embedded (SQLite): ≥ 0.5× the SQLite floor's
	targetCPU         = 2.5 // CPU per withdrawal, all processes: ≤ 2.5× the floor's on the same database
	targetCommits     = 2.0 // PostgreSQL + Redis, tokens off: commits per withdrawal ≤ 2
)

// rule is a target: a figure at least (or at most) want.
type rule struct {
	want   float64
	atMost bool
}

// met compares x as it is printed (2 decimals): a count of 2.0004 commits
// per withdrawal (a request straddling the window's edge) is 2.00, at the
// target, not above it.
func (t rule) met(x float64) bool {
	x = math.Round(x*100) / 100
	if t.atMost {
		return x <= t.want
	}
	return x >= t.want
}

// verdict is PASS or FAIL on the median figure, as the old block's; TIE
// when the rounds' own figures fall on both sides of the target.
func (t rule) verdict(median float64, perRound []float64) string {
	var pass, fail bool
	for _, x := range perRound {
		if t.met(x) {
			pass = true
		} else {
			fail = true
		}
	}
	switch {
	case pass && fail:
		return "TIE"
	case t.met(median):
		return "PASS"
	default:
		return "FAIL"
	}
}

func (t rule) String() string {
	if t.atMost {
		return "≤"
	}
	return "≥"
}

// ran says whether a round's cell ran (summarize's rule).
func ran(c *cellResult) bool { return !(c.ok == 0 && c.err != "") }

// cellCPUPerWd is a cell's CPU time per withdrawal (pgbench: transaction)
// in ms, all processes measured for it: the service, postgres, Redis and
// the client, those that do not apply left out; false when one that
// applies is unknown or nothing ended.
func cellCPUPerWd(c *cellResult) (float64, bool) {
	if !ran(c) || c.rate() <= 0 {
		return 0, false
	}
	sum := 0.0
	for _, i := range []int{cpuSvc, cpuPG, cpuRedis, cpuLoad} {
		switch v := c.cpu[i]; {
		case v == cpuNA:
		case v < 0 || math.IsNaN(v):
			return 0, false
		default:
			sum += v
		}
	}
	return 1000 * sum / c.rate(), true
}

// cpuPerWd is the median over rounds of cellCPUPerWd.
func (r *report) cpuPerWd(g string, n int) (float64, bool) {
	var xs []float64
	for _, c := range r.cells[cellKey(g, n)] {
		if x, ok := cellCPUPerWd(c); ok {
			xs = append(xs, x)
		}
	}
	return median(xs), len(xs) > 0
}

// perRound is each round's f(g's cell) / f(its floor's cell), rounds
// paired by index as the old block pairs them.
func (r *report) perRound(g, fl string, n int, f func(*cellResult) (float64, bool)) []float64 {
	var out []float64
	a, b := r.cells[cellKey(g, n)], r.cells[cellKey(fl, n)]
	for i := range min(len(a), len(b)) {
		x, ok1 := f(a[i])
		y, ok2 := f(b[i])
		if ok1 && ok2 && y > 0 {
			out = append(out, x/y)
		}
	}
	return out
}

func cellRate(c *cellResult) (float64, bool) { return c.rate(), ran(c) }

func fmtPer(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, " ")
}

func targetLabel(g string) string {
	label := groupLabels[g]
	if st := submitTokens(g); st != "-" {
		label += " (submit tokens " + st + ")"
	}
	return label
}

// issue22Lines are issue 22's target lines; commits is, per group, its
// PostgreSQL commits per withdrawal of each round (roundCommits). A
// figure that cannot be computed (a group not run) has no line.
func (r *report) issue22Lines(commits map[string][]float64) []string {
	var lines []string
	for _, n := range r.sortedClients() {
		for _, t := range []struct {
			g string
			r rule
		}{{groupPostgres, rule{want: targetPGFloor}}, {groupTokens, rule{want: targetTokensFloor}}, {groupChain, rule{want: targetTokensFloor}}, {groupSQLite, rule{want: targetSQLiteFloor}}} {
			fl := floorOf(t.g)
			s, ok1 := r.summarize(t.g, n)
			f, ok2 := r.summarize(fl, n)
			if !ok1 || !ok2 || s.rounds == 0 || f.rounds == 0 || f.rate <= 0 {
				continue
			}
			ratio, per := s.rate/f.rate, r.perRound(t.g, fl, n, cellRate)
			lines = append(lines, fmt.Sprintf("%-55s %3d clients  withdrawals/s %.2f× the floor's (%.0f/s vs %.0f/s, want %s %.2f×)  %s  per round: %s",
				targetLabel(t.g), n, ratio, s.rate, f.rate, t.r, t.r.want, t.r.verdict(ratio, per), fmtPer(per)))
			if t.g == groupTokens {
				if m, ok := r.summarize(groupFloorMinted, n); ok && m.rounds > 0 && m.rate > 0 {
					ratio, per := s.rate/m.rate, r.perRound(t.g, groupFloorMinted, n, cellRate)
					lines = append(lines, fmt.Sprintf("%-55s %3d clients  withdrawals/s %.2f× the minted floor's (%.0f/s vs %.0f/s; the minted floor %.2f× the floor's)  informational  per round: %s",
						targetLabel(t.g), n, ratio, s.rate, m.rate, m.rate/f.rate, fmtPer(per)))
				}
			}
			if t.g != groupSQLite {
				continue
			}
			if g, ok := r.summarize(groupFloorGrouped, n); ok && g.rounds > 0 && g.rate > 0 {
				ratio, per := s.rate/g.rate, r.perRound(t.g, groupFloorGrouped, n, cellRate)
				lines = append(lines, fmt.Sprintf("%-55s %3d clients  withdrawals/s %.2f× the grouped floor's (%.0f/s vs %.0f/s, want %s %.2f×)  %s  per round: %s",
					targetLabel(t.g), n, ratio, s.rate, g.rate, t.r, t.r.want, t.r.verdict(ratio, per), fmtPer(per)))
			}
		}
	}
	cpuRule := rule{want: targetCPU, atMost: true}
	for _, n := range r.sortedClients() {
		for _, g := range []string{groupPostgres, groupTokens, groupChain, groupSQLite} {
			fl := floorOf(g)
			x, ok1 := r.cpuPerWd(g, n)
			y, ok2 := r.cpuPerWd(fl, n)
			if !ok1 || !ok2 || y <= 0 {
				continue
			}
			ratio, per := x/y, r.perRound(g, fl, n, cellCPUPerWd)
			lines = append(lines, fmt.Sprintf("%-55s %3d clients  CPU per withdrawal %.2f× the floor's (%.2f ms vs %.2f ms, want %s %.2f×)  %s  per round: %s",
				targetLabel(g), n, ratio, x, y, cpuRule, cpuRule.want, cpuRule.verdict(ratio, per), fmtPer(per)))
		}
	}
	for _, n := range r.sortedClients() {
		for _, g := range []string{groupPostgres, groupTokens, groupChain} {
			per := r.perRoundOne(g, n, func(c *cellResult) (float64, bool) { return c.writeTxsPer() })
			if len(per) == 0 {
				continue
			}
			cr := rule{want: targetCommits, atMost: true}
			m := median(per)
			lines = append(lines, fmt.Sprintf("%-55s %3d clients  durable commits (at most: write transactions) per withdrawal %.2f (want %s %.2f)  %s  per round: %s",
				targetLabel(g), n, m, cr, cr.want, cr.verdict(m, per), fmtPer(per)))
		}
	}
	if per := commits[groupPostgres]; len(per) > 0 {
		// An upper bound (read-only and non-withdrawal commits count too):
		// it proves the target when every round is at or under it, and
		// says nothing otherwise; the write-transaction lines decide.
		cr := rule{want: targetCommits, atMost: true}
		m := median(per)
		verdict := cr.verdict(m, per)
		if verdict != "PASS" {
			verdict = "no verdict: an upper bound over the target"
		}
		lines = append(lines, fmt.Sprintf("%-55s  per round   commits per withdrawal %.2f (want %s %.2f)  %s  per round: %s",
			targetLabel(groupPostgres), m, cr, cr.want, verdict, fmtPer(per)))
	}
	return lines
}

// perRoundOne is f of each round's cell of group g at n clients that has it.
func (r *report) perRoundOne(g string, n int, f func(*cellResult) (float64, bool)) []float64 {
	var out []float64
	for _, c := range r.cells[cellKey(g, n)] {
		if c == nil || (c.ok == 0 && c.err != "") {
			continue
		}
		if x, ok := f(c); ok {
			out = append(out, x)
		}
	}
	return out
}

// printTargets22 prints issue 22's targets after the old ones.
func (r *report) printTargets22(out io.Writer, commits map[string][]float64) {
	lines := r.issue22Lines(commits)
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(out, "\nissue 22 targets (medians; per round: that round's pair; TIE: the rounds fall on both sides of the target, whatever the median):")
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
	fmt.Fprintln(out, "withdrawals/s against the floor on the same database at the same clients; CPU per withdrawal: service + postgres + Redis + client CPU")
	fmt.Fprintln(out, "(those that apply: the PostgreSQL floor has no Redis, the SQLite rows neither PostgreSQL nor Redis) over the window / withdrawals/s, median over rounds;")
	if len(commits[groupPostgres]) > 0 {
		fmt.Fprintln(out, "commits per withdrawal: the database-work line of each round below, i.e. pg_stat_database xact_commit of the service's database from before its start")
		fmt.Fprintln(out, "to after its stop (read-only transactions included, so it bounds the durable commits from above; warm-ups, top-up deposits, balance checks,")
		fmt.Fprintln(out, "and in round 1 sign-ups and first deposits included) / the withdrawals sent in the round (warm-ups included), as printed there (2 decimals):")
		fmt.Fprintln(out, "PASS when every round is at or under the target, else no verdict (the durable-commit lines, from write transactions, decide)")
	}
}

// roundCommits is, per group, the commits per withdrawal of each round
// that measured them, read back from its database-work lines (the
// figure as they print it).
func roundCommits(services []*serviceConfig) map[string][]float64 {
	m := map[string][]float64{}
	for _, s := range services {
		for _, w := range s.workNotes {
			if x, ok := noteCommits(w); ok {
				m[s.group] = append(m[s.group], x)
			}
		}
	}
	return m
}

// noteCommits is the commits per withdrawal of a work note "round N: X
// commits…".
func noteCommits(note string) (float64, bool) {
	var round int
	var x float64
	if _, err := fmt.Sscanf(note, "round %d: %f commits", &round, &x); err != nil {
		return 0, false
	}
	return x, true
}

// abLines compare build B with build A in each configuration both ran
// (sqlite-b with sqlite, postgres-b with postgres, postgres-tokens-b with
// postgres-tokens) at each client count: withdrawals/s and CPU per
// withdrawal, B over A, paired by round (the two ran in the same round,
// one after the other in the rotated order); a side is said to be ahead
// only when it is in every round.
func (r *report) abLines() []string {
	var lines []string
	for _, bg := range allGroups { // buildA's groups, in a round's order
		ag, isB := buildA[bg]
		if !isB {
			continue
		}
		for _, n := range r.sortedClients() {
			a, ok1 := r.summarize(ag, n)
			b, ok2 := r.summarize(bg, n)
			if !ok1 || !ok2 || a.rounds == 0 || b.rounds == 0 || a.rate <= 0 {
				continue
			}
			per := r.perRound(bg, ag, n, cellRate)
			line := fmt.Sprintf("%-13s %3d clients  withdrawals/s B/A %.2f× (%.0f/s vs %.0f/s)  %s  per round: %s", abConfig(bg), n, b.rate/a.rate, b.rate, a.rate, abVerdict(per, true), fmtPer(per))
			if x, okx := r.cpuPerWd(bg, n); okx {
				if y, oky := r.cpuPerWd(ag, n); oky && y > 0 {
					cper := r.perRound(bg, ag, n, cellCPUPerWd)
					line += fmt.Sprintf("; CPU per withdrawal B/A %.2f× (%.2f ms vs %.2f ms)  %s  per round: %s", x/y, x, y, abVerdict(cper, false), fmtPer(cper))
				}
			}
			lines = append(lines, line)
		}
	}
	return lines
}

// abConfig names the configuration of a build B group in abLines.
func abConfig(bg string) string {
	switch bg {
	case groupSQLiteB:
		return "SQLite:"
	case groupTokensB:
		return "default:"
	}
	return "tokens off:"
}

// abVerdict says which build the per-round ratios (B over A) favour:
// B when every round is above 1 (higher is better) or below 1 (lower is
// better), A when every round is on the other side, else neither.
func abVerdict(per []float64, higherBetter bool) string {
	above, below := 0, 0
	for _, x := range per {
		switch {
		case x > 1:
			above++
		case x < 1:
			below++
		}
	}
	bAhead, aAhead := above, below
	if !higherBetter {
		bAhead, aAhead = below, above
	}
	switch {
	case len(per) == 0:
		return "no rounds"
	case bAhead == len(per):
		return "B ahead in every round"
	case aAhead == len(per):
		return "A ahead in every round"
	}
	return fmt.Sprintf("not resolved (B ahead in %d of %d rounds)", bAhead, len(per))
}

// printAB prints abLines, when build B ran.
func (r *report) printAB(out io.Writer) {
	lines := r.abLines()
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(out, "\nA/B: build B (-bin-b) against build A (-bin or the repository's) in the same configuration (SQLite; PostgreSQL + Redis, tokens off;")
	fmt.Fprintln(out, "default: PostgreSQL + Redis, a token minted per withdrawal), each on its own database, in the same rounds:")
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
}
