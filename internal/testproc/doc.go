// Package testproc starts the servers that tests and the benchmarks run
// as child processes (redis-server, nats-server, PostgreSQL's pgbench,
// the service) so that they die with the process that started them.
package testproc

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// LookPath returns the path of the program name: on PATH, or in /usr/sbin,
// where Debian installs servers and which a user's PATH may not hold; ""
// when it is in neither.
func LookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join("/usr/sbin", name); fileExists(p) {
		return p
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Buffer is a bytes.Buffer that a child process's output copier and the
// test may use at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
