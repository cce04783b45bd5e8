// Command load measures `onceguard serve` under load: withdrawals/s and
// p50/p99 latency of POST /api/v1/withdrawals for the embedded default
// (SQLite, in-process stores) and for PostgreSQL + Redis, at 16 and 64
// concurrent clients, next to PostgreSQL's own ceiling for a comparable
// one-row-update transaction measured with pgbench in the same run, and
// next to the floors (that transaction behind a minimal HTTP server, on
// PostgreSQL and on SQLite, and on SQLite with its commits grouped as the
// service groups its own), interleaved round by round. The PostgreSQL
// contenders connect through a counting proxy (pgproxy.go) that reports
// their round trips. See ../README.md, "Service load".
//
//	cd bench && go run ./load [-duration 5s] [-rounds 2] [-pairs 10] [-clients 16,64] [-only sqlite,postgres,postgres-tokens,postgres-chain,pgbench,floor,floor-minted,floor-sqlite,floor-sqlite-grouped] [-markdown]
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceguard/onceguard/internal/sqldb"
)

// The groups of a round: the service configurations, the ceiling and the
// floors.
const (
	groupSQLite = "sqlite"
	// groupSQLiteB is groupSQLite run with build B (-bin-b).
	groupSQLiteB  = "sqlite-b"
	groupPostgres = "postgres"
	// groupPostgresB is groupPostgres run with a second build (-bin-b),
	// interleaved with it in every round: an A/B inside one run.
	groupPostgresB = "postgres-b"
	groupTokens    = "postgres-tokens"
	// groupTokensB is groupTokens run with build B (-bin-b): an A/B of
	// the default configuration, a token minted per withdrawal.
	groupTokensB = "postgres-tokens-b"
	// groupChain is groupTokens with each withdrawal's token the one the
	// answer before offered (Next-Submit-Token), as the web page uses
	// them: a mint only for the first.
	groupChain   = "postgres-chain"
	groupPgbench = "pgbench"
	groupFloor   = "floor"
	// groupFloorMinted is the PostgreSQL floor with a submit token minted
	// before each withdrawal (floorMint: the session read, a signed token),
	// as the service's default configuration mints: the least a minted
	// withdrawal costs, the reference the default's target is read against.
	groupFloorMinted = "floor-minted"
	groupFloorSQLite = "floor-sqlite"
	// groupFloorGrouped is the SQLite floor with its commits grouped as
	// the service groups its own (sqldb.WriteGate's default): fewer
	// commits than withdrawals, so not pgbench's transaction any more,
	// but the same machinery as the service.
	groupFloorGrouped = "floor-sqlite-grouped"
)

// allGroups is every group, in the order of a first round.
var allGroups = []string{groupPgbench, groupSQLite, groupSQLiteB, groupPostgres, groupPostgresB, groupTokens, groupTokensB, groupChain, groupFloor, groupFloorMinted, groupFloorSQLite, groupFloorGrouped}

var groupLabels = map[string]string{
	groupSQLite:       "embedded (SQLite)",
	groupSQLiteB:      "embedded (SQLite), build B",
	groupPostgres:     "PostgreSQL + Redis",
	groupPostgresB:    "PostgreSQL + Redis, build B",
	groupTokens:       "PostgreSQL + Redis, default",
	groupTokensB:      "PostgreSQL + Redis, default, build B",
	groupChain:        "PostgreSQL + Redis, default, chained",
	groupPgbench:      "ceiling: pgbench",
	groupFloor:        "floor: pgbench tx over HTTP",
	groupFloorMinted:  "floor, a token minted per withdrawal",
	groupFloorSQLite:  "floor: SQLite tx over HTTP",
	groupFloorGrouped: "floor: SQLite, grouped commits",
}

// floorOf is the floor a group's "vs floor" ratio is taken against: the
// floor on the same database; "" for the floors and the ceiling.
func floorOf(g string) string {
	switch g {
	case groupSQLite, groupSQLiteB:
		return groupFloorSQLite
	case groupPostgres, groupPostgresB, groupTokens, groupTokensB, groupChain, groupFloorMinted:
		return groupFloor
	}
	return ""
}

// buildA maps the groups of build B (-bin-b) to the groups of build A
// they are compared with: the same configuration, a database each.
var buildA = map[string]string{groupSQLiteB: groupSQLite, groupPostgresB: groupPostgres, groupTokensB: groupTokens}

// checkBuildB says what is wrong with the groups to run (those -only
// named, the build B groups with their build A's) given the names in
// -only and whether -bin-b was given: a build B group named needs
// -bin-b, one run needs its build A group, and -bin-b needs one run.
func checkBuildB(only, groups []string, binB bool) error {
	var named, run []string
	for _, g := range only {
		if _, isB := buildA[g]; isB {
			named = append(named, g)
		}
	}
	for _, g := range groups {
		if a, isB := buildA[g]; isB {
			run = append(run, g)
			if binB && !slices.Contains(groups, a) {
				return fmt.Errorf("-only %s runs beside the group %s: name it too", g, a)
			}
		}
	}
	switch {
	case !binB && len(named) > 0:
		return fmt.Errorf("-only %s needs -bin-b", strings.Join(named, ","))
	case binB && len(run) == 0:
		return fmt.Errorf("-bin-b runs beside the group %s, %s or %s: name one in -only", groupSQLite, groupPostgres, groupTokens)
	}
	return nil
}

// usesPG says whether a group talks to PostgreSQL (through a proxy).
func usesPG(g string) bool {
	return g == groupPostgres || g == groupPostgresB || g == groupTokens || g == groupTokensB || g == groupChain || g == groupPgbench || g == groupFloor || g == groupFloorMinted
}

type config struct {
	duration, warmup time.Duration
	rounds           int
	clients          []int
	groups           []string
	pgDSN            string // admin DSN: the run creates and drops its databases through it
	redisURL         string
	pgbench          string
	pgbenchJobs      int
	bin, repo        string
	binB             string // a second build, run as the build B groups (buildA)
	dbConns          int
	markdown, keep   bool
	proxy            bool // put a round-trip-counting proxy between each PostgreSQL contender and the server
	// pairs of blocks of each contender and its reference after the
	// rounds (pairs.go), each block pairWarmup + pairBlock; 0: none.
	pairs                 int
	pairBlock, pairWarmup time.Duration
}

func main() {
	var cfg config
	var clients, only, floorDSN, floorSQLite, proxyUpstream string
	var floorGroup int
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured `time` per cell (configuration × clients × round)")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "unmeasured warm-up per cell, same clients")
	flag.IntVar(&cfg.rounds, "rounds", 2, "rounds; each runs every configuration at every client count, the table shows medians")
	flag.StringVar(&clients, "clients", "16,64", "comma-separated numbers of concurrent clients (each its own user)")
	flag.StringVar(&only, "only", "", "comma-separated groups to run: sqlite, postgres, postgres-tokens, postgres-chain, pgbench, floor, floor-minted, floor-sqlite, floor-sqlite-grouped (default: all)")
	flag.StringVar(&cfg.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL admin `DSN`; the run creates (and at exit drops) a fresh database for the service and one for pgbench through it")
	flag.StringVar(&cfg.redisURL, "redis", "redis://127.0.0.1:6379/0", "Redis `URL` for the PostgreSQL configuration (shared: only the service's keys of this run's users are touched)")
	flag.StringVar(&cfg.pgbench, "pgbench", "/usr/bin/pgbench", "pgbench `binary` for the ceiling (empty: no ceiling)")
	flag.IntVar(&cfg.pgbenchJobs, "pgbench-jobs", runtime.NumCPU(), "pgbench -j (threads), at most the clients")
	flag.StringVar(&cfg.bin, "bin", "", "onceguard `binary` to run (default: build ./cmd/onceguard of the repository into a temporary directory)")
	flag.StringVar(&cfg.binB, "bin-b", "", "a second onceguard `binary`, run as the group sqlite-b beside sqlite, postgres-b (PostgreSQL + Redis, tokens off, its own database) beside postgres and postgres-tokens-b (the default configuration) beside postgres-tokens, in every round: an A/B in one run")
	flag.StringVar(&cfg.repo, "repo", "", "repository root (`dir`) to build from (default: found upwards from the working directory)")
	flag.IntVar(&cfg.dbConns, "db-conns", 0, "pass --db-conns N to the PostgreSQL service (0: the service's default)")
	flag.BoolVar(&cfg.markdown, "markdown", false, "print the table as Markdown")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (service logs, pgbench logs, SQLite file) and the databases")
	flag.BoolVar(&cfg.proxy, "pg-proxy", true, "connect every PostgreSQL contender through a proxy of its own that counts its round trips (false: directly, no round-trip figures)")
	flag.IntVar(&cfg.pairs, "pairs", 0, "after the rounds, run `N` pairs of blocks of each contender and its reference (its floor; build B and build A) back to back, and judge the targets from the pairs' 95% interval (0: none)")
	flag.DurationVar(&cfg.pairBlock, "pair-block", 2*time.Second, "measured `time` of one block of -pairs")
	flag.DurationVar(&cfg.pairWarmup, "pair-warmup", 500*time.Millisecond, "unmeasured warm-up of one block of -pairs")
	flag.StringVar(&floorDSN, "floor-serve", "", "internal: serve the floor group's minimal withdrawal server on `DSN` (the load starts itself this way)")
	flag.StringVar(&floorSQLite, "floor-sqlite-serve", "", "internal: serve the floor-sqlite group's minimal withdrawal server on the SQLite `file`")
	flag.IntVar(&floorGroup, "floor-sqlite-group", 1, "internal: with -floor-sqlite-serve, how many withdrawals one COMMIT may hold (sqldb.WriteGate's MaxGroup)")
	flag.StringVar(&proxyUpstream, "pg-proxy-serve", "", "internal: serve a round-trip-counting proxy to `host:port`")
	flag.Parse()
	if proxyUpstream != "" {
		if err := serveProxy(proxyUpstream); err != nil {
			fmt.Fprintln(os.Stderr, "load: proxy:", err)
			os.Exit(1)
		}
		return
	}
	if floorDSN != "" || floorSQLite != "" {
		driver, dsn := "pgx", floorDSN
		if floorSQLite != "" {
			driver, dsn = "sqlite", floorSQLite
		}
		if err := serveFloor(driver, dsn, floorGroup); err != nil {
			fmt.Fprintln(os.Stderr, "load: floor:", err)
			os.Exit(1)
		}
		return
	}
	for _, s := range strings.Split(clients, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "load: -clients: %q is not a positive number\n", s)
			os.Exit(2)
		}
		if !slices.Contains(cfg.clients, n) {
			cfg.clients = append(cfg.clients, n)
		}
	}
	onlyList := strings.Split(strings.ReplaceAll(only, " ", ""), ",")
	for _, g := range allGroups {
		// A build B group comes with its build A group: an A/B needs both.
		if a, isB := buildA[g]; only == "" || slices.Contains(onlyList, g) || isB && slices.Contains(onlyList, a) {
			cfg.groups = append(cfg.groups, g)
		}
	}
	if err := checkBuildB(onlyList, cfg.groups, cfg.binB != ""); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	if cfg.binB == "" {
		cfg.groups = slices.DeleteFunc(cfg.groups, func(g string) bool { _, isB := buildA[g]; return isB })
	}
	if cfg.pgbench == "" {
		cfg.groups = slices.DeleteFunc(cfg.groups, func(g string) bool { return g == groupPgbench })
	}
	if cfg.rounds < 1 || cfg.duration <= 0 || cfg.warmup < 0 || len(cfg.clients) == 0 || len(cfg.groups) == 0 || cfg.pgbenchJobs < 1 ||
		cfg.pairs < 0 || cfg.pairs > 0 && (cfg.pairBlock <= 0 || cfg.pairWarmup < 0) {
		fmt.Fprintln(os.Stderr, "load: want -rounds >= 1, -duration > 0, -warmup >= 0, -pgbench-jobs >= 1, -pairs >= 0 (with -pair-block > 0, -pair-warmup >= 0), some -clients and some -only group")
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// cleanups run in reverse order at exit, also after an error.
type cleanups []func()

func (c *cleanups) add(f func()) { *c = append(*c, f) }
func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

func run(cfg config, out, progress io.Writer) error {
	began := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	context.AfterFunc(ctx, stop) // a second signal kills the run (children die with it)
	var cl cleanups
	defer cl.run()

	var idb [4]byte
	_, _ = rand.Read(idb[:])
	runID := hex.EncodeToString(idb[:])
	tmp, err := os.MkdirTemp("", "ogload-"+runID+"-")
	if err != nil {
		return err
	}
	cl.add(func() {
		if cfg.keep {
			fmt.Fprintf(progress, "kept %s\n", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	})
	loadBefore := loadAvg()
	has := func(g string) bool { return slices.Contains(cfg.groups, g) }
	maxClients := slices.Max(cfg.clients)

	// The service binary, built from the main module (its own go.mod, so
	// with exactly the dependencies it ships with).
	bin, binInfo := cfg.bin, ""
	if has(groupSQLite) || has(groupPostgres) || has(groupTokens) || has(groupChain) {
		if cfg.binB != "" {
			binInfo = "; build B (" + groupSQLiteB + ", " + groupPostgresB + ", " + groupTokensB + "): " + cfg.binB
		}
		if bin == "" {
			repo := cfg.repo
			if repo == "" {
				if repo, err = findRepo(); err != nil {
					return err
				}
			}
			bin = filepath.Join(tmp, "onceguard")
			fmt.Fprintf(progress, "building %s/cmd/onceguard ...\n", repo)
			build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/onceguard")
			build.Dir = repo
			if b, err := build.CombinedOutput(); err != nil {
				return fmt.Errorf("go build ./cmd/onceguard in %s: %v\n%s", repo, err, b)
			}
			binInfo = "built from " + repo + gitDescribe(repo) + binInfo
		} else {
			binInfo = bin + binInfo
		}
	}

	// PostgreSQL: fresh databases of this run.
	var pg *pgAdmin
	var serverLines []string
	if slices.ContainsFunc(cfg.groups, usesPG) {
		if pg, err = openPG(ctx, cfg.pgDSN); err != nil {
			return err
		}
		cl.add(pg.close)
		serverLines = append(serverLines, pg.describe(ctx))
	}
	// One counting proxy per PostgreSQL contender, for the whole run.
	proxies := map[string]*pgProxy{}
	var upstream string
	if cfg.proxy && pg != nil {
		if upstream, err = pgUpstream(cfg.pgDSN); err != nil {
			return err
		}
		for _, g := range cfg.groups {
			if !usesPG(g) {
				continue
			}
			p, err := startProxy(g, upstream, filepath.Join(tmp, "proxy-"+g+".log"))
			if err != nil {
				return err
			}
			cl.add(p.stop)
			proxies[g] = p
		}
		serverLines = append(serverLines, fmt.Sprintf("round trips: each PostgreSQL contender connects through a proxy of its own (a child process of this command, loopback, to %s) that counts its Sync and Query messages", upstream))
	}
	// pgDSNFor is the DSN of database name for group g: through its proxy.
	pgDSNFor := func(g, name string) string {
		dsn := withDatabase(cfg.pgDSN, name)
		if p := proxies[g]; p != nil {
			dsn = withHost(dsn, p.addr)
		}
		return dsn
	}
	var pgb *pgbenchCeiling
	if has(groupPgbench) {
		name := "ogload_" + runID + "_pgbench"
		if err := pg.createDB(ctx, name); err != nil {
			return err
		}
		cl.add(func() { pg.dropDB(name, cfg.keep, progress) })
		if pgb, err = setupPgbench(ctx, cfg, pg, name, tmp, maxClients); err != nil {
			return err
		}
		pgb.conn, pgb.proxy = pgDSNFor(groupPgbench, name), proxies[groupPgbench]
		serverLines = append(serverLines, pgb.describe())
	}

	// The service configurations.
	var services []*serviceConfig
	// --signup-limit -1: the clients are users signed up from one address,
	// more of them than the service lets one address create in an hour
	// with -clients over 100. --rate-limit 0: and they send more requests a
	// second, from that one address, than the service's default per-address
	// limit (2000/s) lets through; a real deployment's clients come from
	// many addresses, and the floor has no limit.
	baseArgs := []string{"serve", "--addr", "127.0.0.1:0", "--require-submit-token", "", "--signup-limit", "-1", "--rate-limit", "0"}
	for _, g := range []string{groupSQLite, groupSQLiteB} {
		if !has(g) {
			continue
		}
		dir, gbin, id := filepath.Join(tmp, g+"-data"), bin, runID
		if g == groupSQLiteB {
			gbin, id = cfg.binB, runID+"b"
		}
		services = append(services, &serviceConfig{group: g, bin: gbin, runID: id,
			args: append(slices.Clone(baseArgs), "--data-dir", dir), logPath: filepath.Join(tmp, "service-"+g+".log"),
			sqlitePath: filepath.Join(dir, "onceguard.db")})
	}
	// PostgreSQL + Redis: with submit tokens off like the others (and so
	// build B, with -bin-b), and in the default configuration
	// (--require-submit-token withdrawal).
	var rc *redisAdmin
	for _, g := range []string{groupPostgres, groupPostgresB, groupTokens, groupTokensB, groupChain} {
		if !has(g) {
			continue
		}
		name, svcArgs, id, gbin := "ogload_"+runID, slices.Clone(baseArgs), runID, bin
		if _, isB := buildA[g]; isB {
			name, id, gbin = name+"_b", runID+"b", cfg.binB
		}
		switch g {
		case groupTokens, groupTokensB, groupChain:
			name, id = name+"_tokens", id+"t"
			if g == groupChain {
				name, id = name+"_chain", id+"c"
			}
			svcArgs = slices.DeleteFunc(svcArgs, func(a string) bool { return a == "--require-submit-token" || a == "" })
		}
		if err := pg.createDB(ctx, name); err != nil {
			return err
		}
		cl.add(func() { pg.dropDB(name, cfg.keep, progress) })
		args := append(svcArgs, "--data-dir", filepath.Join(tmp, g+"-data"), "--db", pgDSNFor(g, name), "--redis", cfg.redisURL)
		if cfg.dbConns > 0 {
			args = append(args, "--db-conns", strconv.Itoa(cfg.dbConns))
		}
		if rc == nil {
			if rc, err = newRedisAdmin(cfg.redisURL); err != nil {
				return err
			}
			cl.add(rc.close)
			serverLines = append(serverLines, rc.describe(ctx))
		}
		s := &serviceConfig{group: g, bin: gbin, runID: id, args: args, logPath: filepath.Join(tmp, "service-"+g+".log"), redis: rc, pg: pg, dbName: name, tokens: tokensOf(g), proxy: proxies[g]}
		cl.add(func() { s.cleanupRedis(progress) })
		services = append(services, s)
	}
	for _, g := range []string{groupFloor, groupFloorMinted} {
		if !has(g) {
			continue
		}
		name := "ogload_" + runID + "_" + strings.ReplaceAll(g, "-", "_")
		if err := pg.createDB(ctx, name); err != nil {
			return err
		}
		cl.add(func() { pg.dropDB(name, cfg.keep, progress) })
		dsn := withDatabase(cfg.pgDSN, name)
		if err := pg.exec(ctx, dsn, floorSchema); err != nil {
			return fmt.Errorf("floor schema: %w", err)
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		services = append(services, &serviceConfig{group: g, bin: self, runID: runID, args: []string{"-floor-serve", pgDSNFor(g, name)},
			logPath: filepath.Join(tmp, g+".log"), pg: pg, dbName: name, tokens: tokensOf(g), proxy: proxies[g]})
	}
	for _, g := range []string{groupFloorSQLite, groupFloorGrouped} {
		if !has(g) {
			continue
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		dir := filepath.Join(tmp, g+"-data")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		path, group := filepath.Join(dir, "floor.db"), 1
		if g == groupFloorGrouped {
			group = sqldb.DefaultMaxGroup
		}
		services = append(services, &serviceConfig{group: g, bin: self, runID: runID,
			args:    []string{"-floor-sqlite-serve", path, "-floor-sqlite-group", strconv.Itoa(group)},
			logPath: filepath.Join(tmp, g+".log"), sqlitePath: path})
	}
	for _, s := range services {
		cl.add(s.stopQuietly)
	}

	rep := newReport(cfg)
	fmt.Fprintf(progress, "run %s: %d round(s), clients %v, %v measured + %v warm-up per cell, GOMAXPROCS=%d\n",
		runID, cfg.rounds, cfg.clients, cfg.duration, cfg.warmup, runtime.GOMAXPROCS(0))
	for round := range cfg.rounds {
		// Rotate the groups, and the client counts, every round.
		for i := range cfg.groups {
			g := cfg.groups[(i+round)%len(cfg.groups)]
			if ctx.Err() != nil {
				break
			}
			order := make([]int, len(cfg.clients))
			for j := range cfg.clients {
				order[j] = cfg.clients[(j+round)%len(cfg.clients)]
			}
			if g == groupPgbench {
				before, rt0 := pg.stats(pgb.dbName), pgb.proxy.counts()
				var txs int64
				for _, n := range order {
					if ctx.Err() != nil {
						break
					}
					r := pgb.run(ctx, n, cfg.warmup, cfg.duration)
					if ctx.Err() != nil {
						break // interrupted: the cell is left out
					}
					txs += int64(r.samples + r.failed)
					rep.add(g, n, r)
					fmt.Fprintf(progress, "round %d  %-20s %3d clients  %s\n", round+1, groupLabels[g], n, r.progressLine())
				}
				if ctx.Err() == nil {
					pgb.noteRound(round, before, pg.stats(pgb.dbName), rt0, pgb.proxy.counts(), txs)
				}
				continue
			}
			var s *serviceConfig
			for _, sc := range services {
				if sc.group == g {
					s = sc
				}
			}
			if err := s.roundRun(ctx, round, order, maxClients, cfg, rep, progress); err != nil {
				if ctx.Err() != nil {
					break
				}
				return err
			}
		}
	}
	if cfg.pairs > 0 && ctx.Err() == nil {
		if err := runPairs(ctx, cfg, services, rep, progress); err != nil && ctx.Err() == nil {
			return err
		}
	}
	if ctx.Err() != nil {
		rep.interrupted = true
		fmt.Fprintln(progress, "interrupted: the table shows the cells that ran")
	}

	fmt.Fprintf(out, "\nonceguard service load, %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(out, "%s/%s, %d CPUs, GOMAXPROCS=%d (load generator and service share them), %s\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if binInfo != "" {
		fmt.Fprintf(out, "service: onceguard serve, %s; flags %s\n", binInfo, serviceFlagsNote(cfg))
	}
	for _, l := range serverLines {
		fmt.Fprintln(out, l)
	}
	fmt.Fprintf(out, "load average (1/5/15 min) at start %s, at end %s\n", loadBefore, loadAvg())
	fmt.Fprintf(out, "%d round(s) interleaved, %v measured + %v warm-up per cell; medians over rounds\n\n", cfg.rounds, cfg.duration, cfg.warmup)
	rep.print(out, cfg.markdown)
	rep.printTargets(out)
	rep.printTargets22(out, roundCommits(services))
	rep.printAB(out)
	rep.printPairs(out)
	var ceilingWork []string
	if pgb != nil {
		ceilingWork = pgb.workNotes
	}
	rep.printNotes(out, services, ceilingWork)
	fmt.Fprintf(out, "\ntotal run time: %v\n", time.Since(began).Round(100*time.Millisecond))
	return nil
}

func serviceFlagsNote(cfg config) string {
	db := "<fresh database>"
	if cfg.proxy {
		db = "<fresh database, through its proxy>"
	}
	s := `--addr 127.0.0.1:0 --require-submit-token "" --signup-limit -1 --rate-limit 0 (repeat window default 10s); SQLite: --data-dir <tmp>; PostgreSQL: --db ` + db + ` --redis ` + redactURL(cfg.redisURL)
	if cfg.dbConns > 0 {
		s += " --db-conns " + strconv.Itoa(cfg.dbConns)
	}
	if slices.Contains(cfg.groups, groupTokens) {
		s += `; "` + groupLabels[groupTokens] + `": the same without --require-submit-token "" (its default, withdrawal: each withdrawal mints a submit token first)`
	}
	if slices.Contains(cfg.groups, groupChain) {
		s += `; "` + groupLabels[groupChain] + `": the same default, each withdrawal's token the one the answer before offered (Next-Submit-Token), a mint only when none was`
	}
	return s
}

// findRepo walks up from the working directory to the main module's root.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.TrimSpace(line) == "module github.com/onceguard/onceguard" {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of github.com/onceguard/onceguard above the working directory; pass -repo or -bin")
		}
		dir = parent
	}
}

// gitDescribe is " at <commit>" (plus " with local changes"), or "".
func gitDescribe(repo string) string {
	out, err := exec.Command("git", "-C", repo, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	s := " at " + strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

// withDatabase returns dsn (a postgres:// URL) naming database name.
func withDatabase(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Path = "/" + name
	return u.String()
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "***")
	}
	return u.String()
}
