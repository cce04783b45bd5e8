package main

import (
	"context"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// cpuNA marks a server CPU figure that does not apply (SQLite: no server
// process; its work is in the bench's own CPU).
const cpuNA = -2

// cpuSample is the CPU time used so far by the lock's server (user+sys)
// and by this process (getrusage).
type cpuSample struct {
	at          time.Time
	server, own time.Duration
	ok, na      bool
	// mallocs: heap objects this process allocated so far; cmds: commands
	// the lock's server processed so far (cmdsOK false: unknown).
	mallocs uint64
	cmds    int64
	cmdsOK  bool
}

func sampleCPU(lib *library) cpuSample {
	s := cpuSample{at: time.Now(), mallocs: mallocs()}
	if lib.serverCmds != nil {
		s.cmds, s.cmdsOK = lib.serverCmds()
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.own = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if lib.serverCPU == nil {
		s.ok, s.na = true, true
		return s
	}
	s.server, s.ok = lib.serverCPU()
	return s
}

// redisCPU is a Redis server's CPU time (INFO cpu, all of its threads).
func redisCPU(c *redis.Client) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var secs float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			secs += f
		}
	}
	return time.Duration(secs * float64(time.Second)), true
}

// mallocs is the number of heap objects this process has allocated so far
// (runtime/metrics, which, unlike runtime.ReadMemStats, does not stop the
// world).
func mallocs() uint64 {
	m := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return m[0].Value.Uint64()
}

// redisCommands is a Redis server's count of commands processed so far
// (INFO stats total_commands_processed, which counts a command after it
// ran: the reply does not count the INFO that asked).
func redisCommands(c *redis.Client) (int64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// procCPU is the CPU time (utime+stime from /proc/PID/stat, all threads) of
// every process on this machine whose command name is one of names: for a
// database server on the same machine (PostgreSQL's postmaster and
// backends, mariadbd). Processes that exit are not counted any more, so a
// connection closed during the window loses its share; false when /proc
// cannot be read or no such process runs.
func procCPU(names ...string) (time.Duration, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var ticks int64
	found := false
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		comm := s[open+1 : end]
		match := false
		for _, n := range names {
			match = match || comm == n
		}
		if !match {
			continue
		}
		f := strings.Fields(s[end+1:]) // f[0] is field 3 (state): utime is field 14, stime 15
		if len(f) < 13 {
			continue
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ticks += u + st
		found = true
	}
	// USER_HZ is 100 on every Linux architecture.
	return time.Duration(ticks) * 10 * time.Millisecond, found
}

// cpuShare returns the server's and this process's CPU use between a and b,
// in cores (1.0 = one core busy the whole time); -1 unknown, cpuNA for a
// server that does not exist.
func cpuShare(a, b cpuSample) (server, own float64) {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return -1, -1
	}
	own = (b.own - a.own).Seconds() / wall
	switch {
	case a.na:
		return cpuNA, own
	case !a.ok || !b.ok:
		return -1, own
	}
	return (b.server - a.server).Seconds() / wall, own
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
