package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestIOWriteBytes(t *testing.T) {
	io := "rchar: 287015534\nwchar: 757711482\nsyscr: 107137\nsyscw: 375854\nread_bytes: 5152768\nwrite_bytes: 696197120\ncancelled_write_bytes: 0\n"
	if n, ok := ioWriteBytes([]byte(io)); !ok || n != 696197120 {
		t.Errorf("ioWriteBytes = %d, %v; want 696197120, true", n, ok)
	}
	if _, ok := ioWriteBytes([]byte("rchar: 1\n")); ok {
		t.Error("ioWriteBytes found write_bytes in a file without it")
	}
}

// This process's write_bytes grows by what it writes to a file and syncs.
func TestPIDWriteBytesCountsFileWrites(t *testing.T) {
	b0, ok := pidWriteBytes(os.Getpid())
	if !ok {
		t.Skip("no readable /proc/self/io here") // not Linux
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	b1, _ := pidWriteBytes(os.Getpid())
	if b1-b0 < 1<<20 {
		t.Errorf("write_bytes grew by %d after a 1 MiB write; want at least 1 MiB", b1-b0)
	}
}
