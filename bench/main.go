// Command bench compares onceguard's Redis lock (lock/redislock) with
// github.com/bsm/redislock and github.com/go-redsync/redsync/v4 on one Redis
// server, interleaved round by round, and prints the medians together with
// a redis-benchmark SET ceiling and a block of targets. See README.md.
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
	"time"

	"github.com/redis/go-redis/v9"
)

type config struct {
	addr       string
	duration   time.Duration
	warmup     time.Duration
	rounds     int
	only       []string
	markdown   bool
	benchBin   string
	cpuProfile string
}

func main() {
	var cfg config
	var only string
	flag.StringVar(&cfg.addr, "redis", "127.0.0.1:6379", "Redis `host:port` (shared: the bench only touches keys of its own run)")
	flag.DurationVar(&cfg.duration, "duration", 1500*time.Millisecond, "measured `time` per cell (library × scenario × round)")
	flag.DurationVar(&cfg.warmup, "warmup", 250*time.Millisecond, "unmeasured warm-up per cell, same workers")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every library on every scenario, the table shows medians")
	flag.StringVar(&only, "only", "", "comma-separated `names`: a library, a scenario or library/scenario (exact), else a substring of library/scenario; \"ceiling\" selects redis-benchmark")
	flag.BoolVar(&cfg.markdown, "markdown", false, "print the table as Markdown")
	flag.StringVar(&cfg.benchBin, "redis-benchmark", "redis-benchmark", "redis-benchmark `binary` for the ceiling rows (empty: skip them)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to `file`")
	flag.Parse()
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.only = append(cfg.only, strings.ToLower(s))
		}
	}
	if cfg.rounds < 1 || cfg.duration <= 0 || cfg.warmup < 0 {
		fmt.Fprintln(os.Stderr, "bench: -rounds must be >= 1, -duration > 0, -warmup >= 0")
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// selected reports whether the cell "library/scenario" (or
// "ceiling/redis-benchmark") is to run. An -only entry that is exactly a
// library, a scenario or a "library/scenario" selects just that
// ("distinct-1" is not "distinct-16"); any other entry is matched as a
// substring of "library/scenario".
func (c *config) selected(name string) bool {
	if len(c.only) == 0 {
		return true
	}
	name = strings.ToLower(name)
	lib, sc, _ := strings.Cut(name, "/")
	if strings.HasPrefix(name, "bsm/redislock/") {
		lib, sc = "bsm/redislock", strings.TrimPrefix(name, "bsm/redislock/")
	}
	for _, s := range c.only {
		if s == name || s == lib || s == sc {
			return true
		}
		if !exactName(s) && strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// exactName reports whether s names a library, a scenario or a cell exactly.
func exactName(s string) bool {
	libs := []string{"onceguard", "bsm/redislock", "redsync", "ceiling"}
	for _, l := range libs {
		if s == l {
			return true
		}
		for _, sc := range scenarios {
			if s == sc.name || s == l+"/"+sc.name {
				return true
			}
		}
	}
	return s == "ceiling/redis-benchmark"
}

// report holds every round's results of every cell.
type report struct {
	libs     []string
	cells    map[string][]*result       // "library/scenario" -> one per round
	ceilings map[string][]ceilingResult // variant name -> one per round
}

func run(cfg config, out, progress io.Writer) error {
	began := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

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

	admin := redis.NewClient(clientOptions(cfg.addr))
	defer admin.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := admin.Ping(pingCtx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis %s: %w", cfg.addr, err)
	}
	serverVersion := redisVersion(ctx, admin)
	loadBefore := loadAvg()

	var idb [4]byte
	_, _ = rand.Read(idb[:])
	runID := "ogbench-" + hex.EncodeToString(idb[:])
	defer func() {
		// Everything this run wrote lives under runID.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if n, err := deleteKeys(cctx, admin, "*"+runID+"/*"); err != nil {
			fmt.Fprintf(progress, "cleanup of %s keys: %v\n", runID, err)
		} else {
			fmt.Fprintf(progress, "cleanup: deleted %d keys of %s\n", n, runID)
		}
	}()

	libs := newLibraries(cfg.addr)
	defer func() {
		for _, l := range libs {
			_ = l.rdb.Close()
		}
	}()
	rep := &report{cells: map[string][]*result{}, ceilings: map[string][]ceilingResult{}}
	for _, l := range libs {
		rep.libs = append(rep.libs, l.name)
	}

	// The ceiling: size -n so that one run lasts about -duration.
	benchBin := ""
	ceilingN := map[string]int{}
	if cfg.benchBin != "" && cfg.selected("ceiling/redis-benchmark") {
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

	fmt.Fprintf(progress, "run %s: %d round(s), %v per cell + %v warm-up, Redis %s at %s, GOMAXPROCS=%d\n",
		runID, cfg.rounds, cfg.duration, cfg.warmup, serverVersion, cfg.addr, runtime.GOMAXPROCS(0))
	cell := 0
	for round := range cfg.rounds {
		if benchBin != "" {
			for _, v := range ceilingVariants {
				if ctx.Err() != nil {
					break
				}
				r, err := runRedisBenchmark(ctx, benchBin, cfg.addr, runID+"/ceiling", ceilingN[v.name], v.pipeline)
				if err != nil {
					return err
				}
				rep.ceilings[v.name] = append(rep.ceilings[v.name], r)
				fmt.Fprintf(progress, "round %d  %-15s %-16s %10.0f SET/s\n", round+1, "redis-benchmark", v.name, r.rps)
			}
		}
		for _, sc := range scenarios {
			// Rotate the library order every round so that no library
			// always runs first (or right after redis-benchmark).
			for i := range libs {
				lib := libs[(i+round)%len(libs)]
				name := lib.name + "/" + sc.name
				if !cfg.selected(name) || ctx.Err() != nil {
					continue
				}
				cell++
				keyBase := fmt.Sprintf("%s/c%d/%s/%s", runID, cell, lib.name, sc.name)
				before := runtime.NumGoroutine()
				r := runCell(lib, sc, keyBase, cfg.warmup, cfg.duration, admin)
				r.leftover = cleanupCell(admin, runID, cell, progress)
				if n := settleGoroutines(before); n > 0 {
					fmt.Fprintf(progress, "warning: %s left %d goroutine(s) running\n", name, n)
				}
				rep.cells[name] = append(rep.cells[name], r)
				fmt.Fprintf(progress, "round %d  %-15s %-16s %10.0f cycles/s  p50 %-8s p99 %-8s%s\n",
					round+1, lib.name, sc.name, r.cyclesPerSec(), fmtDur(percentile(r.lat, 0.50)), fmtDur(percentile(r.lat, 0.99)), extra(sc, r))
			}
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(progress, "interrupted: the table shows the rounds that ran")
	}
	elapsed := time.Since(began)

	fmt.Fprintf(out, "\nonceguard Redis lock benchmark, %s\n", time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(out, "%s/%s, %d CPUs, GOMAXPROCS=%d, %s; Redis %s at %s (same machine)\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), serverVersion, cfg.addr)
	fmt.Fprintf(out, "load average (1/5/15 min) at start %s, at end %s\n", loadBefore, loadAvg())
	fmt.Fprintf(out, "versions: %s\n", depVersions())
	fmt.Fprintf(out, "%d round(s) interleaved, %v measured + %v warm-up per cell, TTL %v; medians over rounds\n\n",
		cfg.rounds, cfg.duration, cfg.warmup, cycleTTL)
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

// cleanupCell deletes the keys a cell left and returns how many of them
// were locks still held (onceguard's fence records, kept by design for
// FenceRetention, and its waiter-queue records do not count).
func cleanupCell(admin *redis.Client, runID string, cell int, progress io.Writer) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pattern := fmt.Sprintf("*%s/c%d/*", runID, cell)
	var held int64
	iter := admin.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		k := iter.Val()
		keys = append(keys, k)
		if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":q") && !strings.HasSuffix(k, ":qx") {
			held++
		}
	}
	if err := iter.Err(); err != nil {
		fmt.Fprintf(progress, "cleanup scan %s: %v\n", pattern, err)
	}
	for c := range slices.Chunk(keys, 500) {
		if err := admin.Unlink(ctx, c...).Err(); err != nil {
			fmt.Fprintf(progress, "cleanup unlink: %v\n", err)
		}
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
	want := []string{"github.com/onceguard/onceguard", "github.com/bsm/redislock", "github.com/go-redsync/redsync/v4", "github.com/redis/go-redis/v9"}
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
