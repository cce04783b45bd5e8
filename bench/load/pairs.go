package main

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/onceguard/onceguard/bench/internal/stats"
)

// The paired blocks (-pairs N), after the rounds: a contender and its
// reference (the floor on its database; for build B, build A) both
// running, and the load switched between them in short blocks, back to
// back, the reference first in every other pair. A round's cells of the
// two are a minute or more apart, and on a shared machine the floor's rate
// moved by half between rounds; two blocks seconds apart share the
// machine's state, so the ratio of each pair carries little of its drift,
// and their spread gives the interval the verdicts are taken from.

// pairing is a contender and the reference its ratios are taken against.
type pairing struct{ group, ref string }

// pairings are the contenders of groups with their references among
// groups, in groups' order: a service with its floor, and then with the
// floor that does a part of its work too (the default with the minted
// floor, SQLite with the grouped floor); build B with build A in the
// same configuration. The minted floor's own ratio to the floor is the
// rounds'.
func pairings(groups []string) []pairing {
	var ps []pairing
	for _, g := range groups {
		ref, also := floorOf(g), ""
		if a, isB := buildA[g]; isB {
			ref = a
		}
		switch g {
		case groupFloorMinted:
			ref = ""
		case groupTokens:
			also = groupFloorMinted
		case groupSQLite:
			also = groupFloorGrouped
		}
		for _, r := range []string{ref, also} {
			if r != "" && slices.Contains(groups, r) {
				ps = append(ps, pairing{g, r})
			}
		}
	}
	return ps
}

// pairCells are the blocks of one pairing at one client count: pair i is
// group[i] and ref[i].
type pairCells struct{ group, ref []*cellResult }

// pairKey names a pairing's cells at n clients in report.pairs.
func pairKey(p pairing, n int) string { return cellKey(p.group+"|"+p.ref, n) }

// runPairs runs cfg.pairs pairs of blocks of every pairing at every client
// count, each pairing's two servers started together and stopped after
// its last pair. The users are the rounds' (so it runs after at least one
// round); each server's balances are checked at the end, as a round's.
func runPairs(ctx context.Context, cfg config, services []*serviceConfig, rep *report, progress io.Writer) error {
	by := map[string]*serviceConfig{}
	for _, s := range services {
		by[s.group] = s
	}
	for _, p := range pairings(cfg.groups) {
		pair := [2]*serviceConfig{by[p.group], by[p.ref]}
		if pair[0] == nil || pair[1] == nil || pair[0].users == nil || pair[1].users == nil {
			continue // no round set up its users (interrupted)
		}
		if err := runPairing(ctx, cfg, p, pair, rep, progress); err != nil {
			return err
		}
	}
	return nil
}

// runPairing runs one pairing's blocks: pair is its contender's server and
// its reference's.
func runPairing(ctx context.Context, cfg config, p pairing, pair [2]*serviceConfig, rep *report, progress io.Writer) error {
	const when = "paired blocks"
	maxClients := slices.Max(cfg.clients)
	var apis [2]*api
	for i, s := range pair {
		if err := s.start(ctx, when); err != nil {
			return err
		}
		defer s.stop(when) // on an error; a no-op after the stop below
		apis[i] = newAPI(s.proc.base, maxClients)
		defer apis[i].hc.CloseIdleConnections()
	}
	for _, n := range cfg.clients {
		key := pairKey(p, n)
		for k := range cfg.pairs {
			var got [2]*cellResult
			for j := range 2 {
				i := (j + k) % 2 // the reference first in every other pair
				s := pair[i]
				if err := topUp(ctx, apis[i], s.users[:n]); err != nil {
					return fmt.Errorf("%s: top-up deposits: %w", s.group, err)
				}
				probe := cpuProbe{svcPID: s.proc.pid, pg: s.pg != nil, redis: s.redis, proxy: s.proxy, xid: s.pg}
				got[i] = runCell(ctx, apis[i], s.users[:n], cfg.pairWarmup, cfg.pairBlock, probe, s.tokens)
			}
			if ctx.Err() != nil {
				return ctx.Err() // interrupted: the pair is left out
			}
			c := rep.pairs[key]
			if c == nil {
				c = &pairCells{}
				rep.pairs[key] = c
			}
			c.group, c.ref = append(c.group, got[0]), append(c.ref, got[1])
			fmt.Fprintf(progress, "pair %2d  %-40s %3d clients  %.0f / %.0f withdrawals/s = %.2f×\n", k+1,
				groupLabels[p.group]+" / "+shortLabel(p.ref), n, got[0].rate(), got[1].rate(), got[0].rate()/got[1].rate())
		}
	}
	for i, s := range pair {
		s.checkBalances(ctx, apis[i], when)
		s.stop(when)
	}
	return nil
}

// shortLabel names a reference in a pair's progress line.
func shortLabel(g string) string {
	switch g {
	case groupFloor:
		return "PG floor"
	case groupFloorSQLite:
		return "SQLite floor"
	case groupSQLite:
		return "build A, SQLite"
	case groupPostgres:
		return "build A"
	case groupTokens:
		return "build A, default"
	case groupFloorMinted:
		return "minted floor"
	case groupFloorGrouped:
		return "grouped SQLite floor"
	}
	return g
}

// pairTarget is the issue 22 target of a pairing's withdrawals/s ratio;
// false for one that has none: build B against build A, and a service
// against a floor other than its own (informational).
func pairTarget(p pairing) (rule, bool) {
	if p.ref != floorOf(p.group) {
		return rule{}, false
	}
	switch p.group {
	case groupPostgres:
		return rule{want: targetPGFloor}, true
	case groupTokens, groupChain:
		return rule{want: targetTokensFloor}, true
	case groupSQLite:
		return rule{want: targetSQLiteFloor}, true
	}
	return rule{}, false
}

// pairLines are the paired blocks' ratios, one line per pairing and client
// count: withdrawals/s and CPU per withdrawal, the contender's over the
// reference's, as the geometric mean over the pairs with its 95%
// interval, and each target's verdict from that interval.
func (r *report) pairLines() []string {
	var lines []string
	for _, p := range pairings(r.cfg.groups) {
		for _, n := range r.cfg.clients {
			c := r.pairs[pairKey(p, n)]
			if c == nil {
				continue
			}
			var rates, cpus []float64
			for i := range c.group {
				a, b := c.group[i], c.ref[i]
				if ran(a) && ran(b) && b.rate() > 0 {
					rates = append(rates, a.rate()/b.rate())
				}
				x, okx := cellCPUPerWd(a)
				y, oky := cellCPUPerWd(b)
				if okx && oky && y > 0 {
					cpus = append(cpus, x/y)
				}
			}
			geo, lo, hi, k := stats.PairedRatio(rates)
			if k < 2 {
				continue
			}
			line := fmt.Sprintf("%-52s %3d clients  withdrawals/s %.3f× (95%% CI %.3f–%.3f, %d pairs)",
				groupLabels[p.group]+" / "+groupLabels[p.ref], n, geo, lo, hi, k)
			t, target := pairTarget(p)
			if target {
				line += fmt.Sprintf(" %s %.1f× %s", t, t.want, stats.Verdict(lo, hi, t.want, t.atMost))
			}
			if geo, lo, hi, k := stats.PairedRatio(cpus); k >= 2 {
				line += fmt.Sprintf("; CPU per withdrawal %.2f× (95%% CI %.2f–%.2f)", geo, lo, hi)
				if target {
					t := rule{want: targetCPU, atMost: true}
					line += fmt.Sprintf(" %s %.1f× %s", t, t.want, stats.Verdict(lo, hi, t.want, t.atMost))
				}
			}
			lines = append(lines, line)
		}
	}
	return lines
}

// printPairs prints pairLines under their method.
func (r *report) printPairs(out io.Writer) {
	lines := r.pairLines()
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(out, "\npaired blocks (-pairs %d, after the rounds): each contender and its reference running together, the load switched between them\n", r.cfg.pairs)
	fmt.Fprintf(out, "in blocks of %v warm-up + %v measured, back to back, the reference first in every other pair; per pair the contender's figure over\n", r.cfg.pairWarmup, r.cfg.pairBlock)
	fmt.Fprintln(out, "the reference's; the geometric mean over the pairs with its 95% confidence interval (Student's t on the logs); a verdict is PASS when")
	fmt.Fprintln(out, "the whole interval meets the target, FAIL when none of it does, TIE when it spans the target:")
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
}
