// Command bench compares onceguard's Redis lock (lock/redislock) with
// github.com/bsm/redislock and github.com/go-redsync/redsync/v4 on one Redis
// server, interleaved round by round, and prints the medians together with
// a redis-benchmark SET ceiling and a block of targets. A second group of
// scenarios measures onceguard's other backends (lock/sqllock on
// PostgreSQL, MySQL/MariaDB and SQLite, lock/redlock over private
// redis-server processes) against a bare PostgreSQL advisory-lock loop.
// See README.md.
//
//	cd bench && go run . [-redis 127.0.0.1:6379] [-duration 1.5s] [-rounds 3] [-only onceguard,distinct] [-markdown]
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

type config struct {
	addr            string
	duration        time.Duration
	backendDuration time.Duration
	warmup          time.Duration
	rounds          int
	only            []string
	markdown        bool
	benchBin        string
	cpuProfile      string

	pgDSN, mysqlDSN string
	sqlite          bool
	sqliteConns     int
	redlockNodes    int
	redisServer     string
}

func main() {
	var cfg config
	var only string
	flag.StringVar(&cfg.addr, "redis", "127.0.0.1:6379", "Redis `host:port` (shared: the bench only touches keys of its own run), or \"private\": a redis-server (-redis-server) the bench starts on a free loopback port for the Redis group")
	flag.DurationVar(&cfg.duration, "duration", 1500*time.Millisecond, "measured `time` per cell (library × scenario × round) of the Redis group")
	flag.DurationVar(&cfg.backendDuration, "backend-duration", 2*time.Second, "measured `time` per cell of the backends group")
	flag.DurationVar(&cfg.warmup, "warmup", 250*time.Millisecond, "unmeasured warm-up per cell, same workers")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every library on every scenario, the table shows medians")
	flag.StringVar(&only, "only", "", "comma-separated `names`: a group (redis, backends), a library, a scenario or library/scenario (exact), else a substring of library/scenario; \"ceiling\" selects redis-benchmark")
	flag.BoolVar(&cfg.markdown, "markdown", false, "print the table as Markdown")
	flag.StringVar(&cfg.benchBin, "redis-benchmark", "redis-benchmark", "redis-benchmark `binary` for the ceiling rows (empty: skip them)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to `file`")
	flag.StringVar(&cfg.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL `DSN` (pgx) for sqllock-pg and pg-xact-baseline (empty: skip them)")
	flag.StringVar(&cfg.mysqlDSN, "mysql", "root@tcp(127.0.0.1:3306)/test", "MySQL/MariaDB `DSN` (go-sql-driver/mysql) for sqllock-mysql (empty: skip it)")
	flag.BoolVar(&cfg.sqlite, "sqlite", true, "run sqllock-sqlite (a database file in a temporary directory)")
	flag.IntVar(&cfg.sqliteConns, "sqlite-conns", poolSize, "SetMaxOpenConns/SetMaxIdleConns of the SQLite pool")
	flag.IntVar(&cfg.redlockNodes, "redlock-nodes", 3, "redis-server processes to start for redlock-3 (0: skip it)")
	flag.StringVar(&cfg.redisServer, "redis-server", "redis-server", "redis-server `binary` for the redlock nodes")
	flag.Parse()
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.only = append(cfg.only, strings.ToLower(s))
		}
	}
	if cfg.rounds < 1 || cfg.duration <= 0 || cfg.backendDuration <= 0 || cfg.warmup < 0 || cfg.sqliteConns < 1 {
		fmt.Fprintln(os.Stderr, "bench: -rounds must be >= 1, -duration and -backend-duration > 0, -warmup >= 0, -sqlite-conns >= 1")
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// selected reports whether the cell lib/sc of group is to run (the ceiling
// is "ceiling"/"redis-benchmark" of the Redis group). An -only entry that
// is exactly a group, a library, a scenario or a "library/scenario"
// selects just that ("distinct-1" is not "distinct-16"); any other entry is
// matched as a substring of "library/scenario".
func (c *config) selected(lib, sc, group string) bool {
	if len(c.only) == 0 {
		return true
	}
	lib, sc = strings.ToLower(lib), strings.ToLower(sc)
	name := lib + "/" + sc
	for _, s := range c.only {
		if s == name || s == lib || s == sc || s == group {
			return true
		}
		if !exactName(s) && strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// runs reports whether lib runs scenario sc: selected, and blocking if
// the library runs only those.
func (c *config) runs(lib *library, sc scenario) bool {
	return c.selected(lib.name, sc.name, sc.group) && (sc.blocking || !lib.blockingOnly) && !(sc.blocking && lib.tryOnly)
}

// libSelected reports whether any cell of lib is to run.
func (c *config) libSelected(lib, group string) bool {
	for _, sc := range scenarios {
		if sc.group == group && c.selected(lib, sc.name, group) {
			return true
		}
	}
	return false
}

// exactName reports whether s names a group, a library, a scenario or a
// cell exactly.
func exactName(s string) bool {
	if s == groupRedis || s == groupBackends || s == "ceiling/redis-benchmark" {
		return true
	}
	libs := map[string][]string{groupRedis: {"onceguard", libOGRueidis, libMinGoRedis, libMinRueidis, libMinGoRedisFenced, libMinFenced, "bsm/redislock", libBSM1ms, "redsync", "ceiling"}, groupBackends: backendLibs}
	for group, names := range libs {
		for _, l := range names {
			if s == l {
				return true
			}
			for _, sc := range scenarios {
				if sc.group == group && (s == sc.name || s == l+"/"+sc.name) {
					return true
				}
			}
		}
	}
	return false
}

// report holds every round's results of every cell.
type report struct {
	libs     map[string][]string        // group -> library names, in table order
	cells    map[string][]*result       // "library/scenario" -> one per round
	ceilings map[string][]ceilingResult // variant name -> one per round
}

func run(cfg config, out, progress io.Writer) error {
	began := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	// After the first signal the run winds down (the cell in progress ends,
	// then everything is cleaned up); a second one kills the process
	// (private redis-servers die with it: see startChild).
	context.AfterFunc(ctx, stop)

	// Everything started or created is undone here, also on an error.
	var cl cleanups
	defer cl.run()

	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	var idb [4]byte
	_, _ = rand.Read(idb[:])
	runID := "ogbench-" + hex.EncodeToString(idb[:])
	loadBefore := loadAvg()
	rep := &report{libs: map[string][]string{}, cells: map[string][]*result{}, ceilings: map[string][]ceilingResult{}}
	groupLibs := map[string][]*library{}

	// The Redis group, on the shared server: only when something of it runs.
	serverVersion := ""
	var admin *redis.Client
	needRedis := cfg.selected("ceiling", "redis-benchmark", groupRedis)
	for _, l := range []string{"onceguard", libOGRueidis, libMinGoRedis, libMinRueidis, libMinGoRedisFenced, libMinFenced, "bsm/redislock", libBSM1ms, "redsync"} {
		needRedis = needRedis || cfg.libSelected(l, groupRedis)
	}
	where := "same machine"
	if needRedis && cfg.addr == "private" {
		dir, err := os.MkdirTemp("", "ogbench-redis-")
		if err != nil {
			return err
		}
		cl.add(func() { _ = os.RemoveAll(dir) })
		path, err := exec.LookPath(cfg.redisServer)
		if err != nil {
			return fmt.Errorf("-redis private: %w", err)
		}
		nodes, err := startRedisNodes(ctx, path, 1, dir)
		if err != nil {
			return fmt.Errorf("-redis private: %w", err)
		}
		cl.add(func() { stopRedisNodes(nodes) })
		cfg.addr = nodes[0].addr
		where = "a private redis-server started by the bench, same machine, no persistence"
	}
	if needRedis {
		admin = redis.NewClient(clientOptions(cfg.addr))
		cl.add(func() { _ = admin.Close() })
		pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := admin.Ping(pingCtx).Err()
		cancel()
		if err != nil {
			return fmt.Errorf("redis %s: %w", cfg.addr, err)
		}
		serverVersion = redisVersion(ctx, admin)
		cl.add(func() {
			// Everything this run wrote on the shared server lives under runID.
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if n, err := deleteKeys(cctx, admin, "*"+runID+"/*"); err != nil {
				fmt.Fprintf(progress, "cleanup of %s keys: %v\n", runID, err)
			} else {
				fmt.Fprintf(progress, "cleanup: deleted %d keys of %s\n", n, runID)
			}
		})
		libs := newRedisLibraries(cfg.addr, admin)
		for _, l := range libs {
			cl.add(l.close)
			if cfg.libSelected(l.name, groupRedis) {
				groupLibs[groupRedis] = append(groupLibs[groupRedis], l)
			}
		}
	}

	// The backends group.
	bs, err := setupBackends(ctx, &cfg, progress, &cl)
	if err != nil {
		return err
	}
	for _, l := range bs.libs {
		cl.add(l.close)
		groupLibs[groupBackends] = append(groupLibs[groupBackends], l)
	}
	for g, libs := range groupLibs {
		for _, l := range libs {
			rep.libs[g] = append(rep.libs[g], l.name)
		}
	}

	// The ceiling: size -n so that one run lasts about -duration.
	benchBin := ""
	ceilingN := map[string]int{}
	if needRedis && cfg.benchBin != "" && cfg.selected("ceiling", "redis-benchmark", groupRedis) {
		if p, err := exec.LookPath(cfg.benchBin); err != nil {
			fmt.Fprintf(progress, "no ceiling rows: %v\n", err)
		} else {
			benchBin = p
			for _, v := range ceilingVariants {
				r, err := runRedisBenchmark(ctx, benchBin, cfg.addr, runID+"/ceiling", 20000*v.pipeline, v.pipeline)
				if err != nil {
					return err
				}
				ceilingN[v.name] = max(20000, int(r.rps*cfg.duration.Seconds()))
			}
		}
	}

	fmt.Fprintf(progress, "run %s: %d round(s), %v per cell (backends: %v) + %v warm-up, GOMAXPROCS=%d\n",
		runID, cfg.rounds, cfg.duration, cfg.backendDuration, cfg.warmup, runtime.GOMAXPROCS(0))
	cell := 0
	for round := range cfg.rounds {
		if benchBin != "" {
			for _, v := range ceilingVariants {
				if ctx.Err() != nil {
					break
				}
				r, err := runRedisBenchmark(ctx, benchBin, cfg.addr, runID+"/ceiling", ceilingN[v.name], v.pipeline)
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					return err
				}
				rep.ceilings[v.name] = append(rep.ceilings[v.name], r)
				fmt.Fprintf(progress, "round %d  %-16s %-16s %10.0f SET/s\n", round+1, "redis-benchmark", v.name, r.rps)
			}
		}
		for _, sc := range scenarios {
			libs := groupLibs[sc.group]
			duration := cfg.duration
			if sc.group == groupBackends {
				duration = cfg.backendDuration
			}
			if sc.paired {
				var sel []*library
				for i := range libs {
					if lib := libs[(i+round)%len(libs)]; cfg.runs(lib, sc) {
						sel = append(sel, lib)
					}
				}
				if len(sel) == 0 || ctx.Err() != nil {
					continue
				}
				cell++
				prefix := fmt.Sprintf("%s/c%d/", runID, cell)
				before := runtime.NumGoroutine()
				rs := runPaired(sel, sc.goroutines, func(l *library) string { return prefix + l.name + "/" + sc.name }, cfg.warmup, duration)
				for i, lib := range sel {
					r := rs[i]
					r.leftover = cleanupCell(lib, prefix, progress)
					rep.cells[lib.name+"/"+sc.name] = append(rep.cells[lib.name+"/"+sc.name], r)
					fmt.Fprintf(progress, "round %d  %-16s %-16s %10.0f cycles/s  p50 %-8s p99 %-8s\n",
						round+1, lib.name, sc.name, r.cyclesPerSec(), fmtDur(percentile(r.lat, 0.50)), fmtDur(percentile(r.lat, 0.99)))
				}
				if n := settleGoroutines(before); n > 0 {
					fmt.Fprintf(progress, "warning: %s left %d goroutine(s) running\n", sc.name, n)
				}
				continue
			}
			// Rotate the library order every round so that no library
			// always runs first (or right after redis-benchmark).
			for i := range libs {
				lib := libs[(i+round)%len(libs)]
				name := lib.name + "/" + sc.name
				if !cfg.runs(lib, sc) || ctx.Err() != nil {
					continue
				}
				cell++
				prefix := fmt.Sprintf("%s/c%d/", runID, cell)
				keyBase := prefix + name
				before := runtime.NumGoroutine()
				r := runCell(lib, sc, keyBase, cfg.warmup, duration)
				r.leftover = cleanupCell(lib, prefix, progress)
				if n := settleGoroutines(before); n > 0 {
					fmt.Fprintf(progress, "warning: %s left %d goroutine(s) running\n", name, n)
				}
				rep.cells[name] = append(rep.cells[name], r)
				fmt.Fprintf(progress, "round %d  %-16s %-16s %10.0f cycles/s  p50 %-8s p99 %-8s%s\n",
					round+1, lib.name, sc.name, r.cyclesPerSec(), fmtDur(percentile(r.lat, 0.50)), fmtDur(percentile(r.lat, 0.99)), extra(sc, r))
			}
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(progress, "interrupted: the table shows the rounds that ran")
	}
	elapsed := time.Since(began)

	fmt.Fprintf(out, "\nonceguard lock benchmark, %s\n", time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(out, "%s/%s, %d CPUs, GOMAXPROCS=%d, %s\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if needRedis {
		fmt.Fprintf(out, "Redis group: Redis %s at %s (%s)\n", serverVersion, cfg.addr, where)
	}
	for _, s := range bs.servers {
		fmt.Fprintf(out, "backends group: %s\n", s)
	}
	for _, s := range bs.skipped {
		fmt.Fprintf(out, "backends group: skipped %s\n", s)
	}
	fmt.Fprintf(out, "load average (1/5/15 min) at start %s, at end %s\n", loadBefore, loadAvg())
	fmt.Fprintf(out, "versions: %s\n", depVersions())
	fmt.Fprintf(out, "%d round(s) interleaved, %v measured (backends group: %v) + %v warm-up per cell, TTL %v; medians over rounds\n\n",
		cfg.rounds, cfg.duration, cfg.backendDuration, cfg.warmup, cycleTTL)
	if cfg.markdown {
		printMarkdown(out, rep)
	} else {
		printText(out, rep)
	}
	fmt.Fprintln(out)
	printTargets(out, rep)
	fmt.Fprintf(out, "\ntotal run time: %v\n", elapsed.Round(100*time.Millisecond))
	return nil
}

// settleGoroutines waits up to 2s for the goroutine count to fall back to
// what it was before a cell, and returns how many are still above it.
func settleGoroutines(before int) int {
	deadline := time.Now().Add(2 * time.Second)
	for {
		n := runtime.NumGoroutine() - before
		if n <= 0 || time.Now().After(deadline) {
			return max(n, 0)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cleanupCell deletes what a cell left under its prefix and returns how
// many of those records were locks still held.
func cleanupCell(lib *library, prefix string, progress io.Writer) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := lib.cleanup(ctx, prefix)
	if err != nil {
		fmt.Fprintf(progress, "cleanup of %s %s: %v\n", lib.name, prefix, err)
	}
	return held
}

func deleteKeys(ctx context.Context, admin *redis.Client, pattern string) (int, error) {
	iter := admin.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return 0, err
	}
	for c := range slices.Chunk(keys, 500) {
		if err := admin.Unlink(ctx, c...).Err(); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}

func redisVersion(ctx context.Context, rdb *redis.Client) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}

func depVersions() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "?"
	}
	want := []string{"github.com/onceguard/onceguard", "github.com/bsm/redislock", "github.com/go-redsync/redsync/v4", "github.com/redis/go-redis/v9", "github.com/redis/rueidis",
		"github.com/jackc/pgx/v5", "github.com/go-sql-driver/mysql", "modernc.org/sqlite"}
	var parts []string
	for _, w := range want {
		for _, d := range bi.Deps {
			if d.Path == w {
				v := d.Version
				if d.Replace != nil {
					v = "local " + d.Replace.Path
				}
				parts = append(parts, w+" "+v)
			}
		}
	}
	return strings.Join(parts, ", ")
}
