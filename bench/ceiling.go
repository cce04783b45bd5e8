package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ceilingResult is one redis-benchmark run: plain SET requests per second
// (not lock cycles) and its per-request latency percentiles.
type ceilingResult struct {
	rps      float64
	p50, p99 time.Duration
}

// ceilingVariant is one redis-benchmark setting.
type ceilingVariant struct {
	name     string
	pipeline int
}

var ceilingVariants = []ceilingVariant{
	{name: "SET -c 64", pipeline: 1},
	{name: "SET -c 64 -P 16", pipeline: 16},
}

// runRedisBenchmark runs `redis-benchmark --csv -n n -c 64 [-P p] SET key xxx`
// against addr. The custom command is what `-t set` sends (a 3-byte value,
// redis-benchmark's -d default) but on a key of this run, so nothing on
// the shared server is touched.
func runRedisBenchmark(ctx context.Context, bin, addr, key string, n, pipeline int) (ceilingResult, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ceilingResult{}, err
	}
	args := []string{"-h", host, "-p", port, "--csv", "-n", strconv.Itoa(n), "-c", "64"}
	if pipeline > 1 {
		args = append(args, "-P", strconv.Itoa(pipeline))
	}
	args = append(args, "SET", key, "xxx")
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return ceilingResult{}, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return parseBenchmarkCSV(out)
}

// parseBenchmarkCSV reads redis-benchmark --csv output:
//
//	"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
//	"SET key xxx","44247.79","0.961","0.232","0.887",...
func parseBenchmarkCSV(out []byte) (ceilingResult, error) {
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return ceilingResult{}, fmt.Errorf("redis-benchmark csv: %w", err)
	}
	if len(recs) < 2 {
		return ceilingResult{}, fmt.Errorf("redis-benchmark csv: %d rows, want a header and a result", len(recs))
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	row := recs[len(recs)-1]
	get := func(name string) (float64, error) {
		i, ok := col[name]
		if !ok || i >= len(row) {
			return 0, fmt.Errorf("redis-benchmark csv: no column %q", name)
		}
		return strconv.ParseFloat(row[i], 64)
	}
	var r ceilingResult
	if r.rps, err = get("rps"); err != nil {
		return r, err
	}
	ms := func(name string) time.Duration {
		v, err := get(name)
		if err != nil {
			return 0
		}
		return time.Duration(v * float64(time.Millisecond))
	}
	r.p50, r.p99 = ms("p50_latency_ms"), ms("p99_latency_ms")
	return r, nil
}
