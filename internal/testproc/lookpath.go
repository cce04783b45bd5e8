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
	p := filepath.Join("/usr/sbin", name)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
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
