// Package depcheck reads a package's import graph with `go list`, for
// tests that keep the service's layers apart.
package depcheck

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Module is the path of this module.
const Module = "github.com/onceguard/onceguard"

// Package is one package of a graph and what it imports directly.
type Package struct {
	Path    string
	Imports []string
}

// Graph returns pkg and every package it depends on, not counting tests.
func Graph(t *testing.T, pkg string) []Package {
	t.Helper()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command to list the imports with")
		}
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var g []Package
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			g = append(g, Package{Path: f[0], Imports: f[1:]})
		}
	}
	return g
}

// Ours reports whether path is a package of this module.
func Ours(path string) bool { return path == Module || strings.HasPrefix(path, Module+"/") }
