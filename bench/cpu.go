package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// cpuSample is the CPU time used so far by the Redis server (INFO cpu, all
// of its threads) and by this process (getrusage), both user+sys.
type cpuSample struct {
	at          time.Time
	server, own time.Duration
	ok          bool
}

func sampleCPU(admin *redis.Client) cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.own = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := admin.Info(ctx, "cpu").Result()
	if err != nil {
		return s
	}
	var secs float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return s
			}
			secs += f
		}
	}
	s.server = time.Duration(secs * float64(time.Second))
	s.ok = true
	return s
}

// cpuShare returns the server's and this process's CPU use between a and b,
// in cores (1.0 = one core busy the whole time).
func cpuShare(a, b cpuSample) (server, own float64) {
	wall := b.at.Sub(a.at).Seconds()
	if !a.ok || !b.ok || wall <= 0 {
		return -1, -1
	}
	return (b.server - a.server).Seconds() / wall, (b.own - a.own).Seconds() / wall
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
