package main

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The CPU figures of a cell, in cores (1.0 = one core busy the whole
// window); -1 unknown, cpuNA does not apply.
const (
	cpuSvc   = iota // the service process
	cpuPG           // every postgres process on the machine
	cpuRedis        // the Redis server (INFO cpu)
	cpuLoad         // the load generator: this process, or pgbench
	cpuProxy        // the contender's round-trip proxy (progress lines only)
	cpuN
)

const cpuNA = -2

type cpuUse [cpuN]float64

// unknownCPU is a cell's figures before they are measured.
func unknownCPU() cpuUse {
	var u cpuUse
	for i := range u {
		u[i] = -1
	}
	return u
}

// cpuProbe says what to sample for a cell.
type cpuProbe struct {
	svcPID  int         // 0: no service (pgbench)
	pg      bool        // sample PostgreSQL
	redis   *redisAdmin // nil: do not sample Redis
	loadPID int         // 0: this process
	proxy   *pgProxy    // nil: no proxy, no round trips
	xid     *pgAdmin    // nil: no write-transaction count
}

type cpuSnap struct {
	at time.Time
	v  [cpuN]time.Duration
	ok [cpuN]bool
	na [cpuN]bool
	rt proxyCounts // the proxy's totals
	// xid is PostgreSQL's next transaction id, when xidOK: it advances once
	// per transaction that wrote (a read-only one takes none), cluster-wide.
	xid   int64
	xidOK bool
}

func (p cpuProbe) sample() cpuSnap {
	s := cpuSnap{at: time.Now()}
	if p.proxy != nil {
		s.rt = p.proxy.counts() // first: the closest to the window's edge
	}
	if p.xid != nil {
		s.xid, s.xidOK = p.xid.nextXID()
	}
	if p.svcPID > 0 {
		s.v[cpuSvc], s.ok[cpuSvc] = pidCPU(p.svcPID)
	} else {
		s.na[cpuSvc] = true
	}
	if p.pg {
		s.v[cpuPG], s.ok[cpuPG] = procCPU("postgres")
	} else {
		s.na[cpuPG] = true
	}
	if p.redis != nil {
		s.v[cpuRedis], s.ok[cpuRedis] = p.redis.cpu()
	} else {
		s.na[cpuRedis] = true
	}
	if p.loadPID > 0 {
		s.v[cpuLoad], s.ok[cpuLoad] = pidCPU(p.loadPID)
	} else {
		var ru syscall.Rusage
		if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
			s.v[cpuLoad], s.ok[cpuLoad] = time.Duration(ru.Utime.Nano()+ru.Stime.Nano()), true
		}
	}
	if p.proxy != nil {
		s.v[cpuProxy], s.ok[cpuProxy] = pidCPU(p.proxy.pid)
	} else {
		s.na[cpuProxy] = true
	}
	return s
}

// writeTxs is the transactions that wrote, cluster-wide, between two snapshots.
func writeTxs(a, b cpuSnap) (int64, bool) {
	if !a.xidOK || !b.xidOK {
		return 0, false
	}
	return b.xid - a.xid, true
}

// roundTrips is the proxy's round trips between two snapshots.
func roundTrips(a, b cpuSnap) (int64, bool) {
	if !a.rt.ok || !b.rt.ok {
		return 0, false
	}
	return b.rt.roundTrips() - a.rt.roundTrips(), true
}

func cpuShare(a, b cpuSnap) cpuUse {
	var u cpuUse
	wall := b.at.Sub(a.at).Seconds()
	for i := range u {
		switch {
		case a.na[i]:
			u[i] = cpuNA
		case !a.ok[i] || !b.ok[i] || wall <= 0:
			u[i] = -1
		default:
			u[i] = (b.v[i] - a.v[i]).Seconds() / wall
		}
	}
	return u
}

// statCPU is utime+stime (all threads) of a /proc/PID/stat line, and the
// process's command name.
func statCPU(b []byte) (comm string, d time.Duration, ok bool) {
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state): utime is field 14, stime 15
	if len(f) < 13 {
		return "", 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	// USER_HZ is 100 on every Linux architecture.
	return s[open+1 : end], time.Duration(u+st) * 10 * time.Millisecond, true
}

func pidCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	_, d, ok := statCPU(b)
	return d, ok
}

// procCPU sums the CPU time of every process on the machine whose command
// name is name (PostgreSQL's postmaster and backends: the server may be
// shared, and a backend that exits in the window loses its share).
func procCPU(name string) (time.Duration, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var total time.Duration
	found := false
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		comm, d, ok := statCPU(b)
		if ok && comm == name {
			total += d
			found = true
		}
	}
	return total, found
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

func fmtCPU(x float64) string {
	if x == cpuNA {
		return "-"
	}
	if x < 0 || math.IsNaN(x) {
		return "?"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// ioWriteBytes is the write_bytes field of a /proc/PID/io file: the bytes
// the process caused to be written to storage (its dirtied page cache
// pages, counted when dirtied; sockets and pipes not counted).
func ioWriteBytes(b []byte) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// pidWriteBytes is ioWriteBytes of process pid (false where /proc/PID/io
// cannot be read: not Linux, or not this user's process).
func pidWriteBytes(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, false
	}
	return ioWriteBytes(b)
}
