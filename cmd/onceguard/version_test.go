package main

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

// `onceguard version` prints the main module's path and version from the
// build information; a test binary, built from a checkout, is "(devel)".
func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatalf("run(version) = %v; want nil", err)
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build information in the test binary")
	}
	want := bi.Main.Path + " (devel)\n"
	if got := out.String(); got != want {
		t.Errorf("run(version) printed %q; want %q", got, want)
	}
	if !strings.HasPrefix(bi.Main.Path, "github.com/onceguard/onceguard") {
		t.Errorf("main module %q; want github.com/onceguard/onceguard or one of its nested modules", bi.Main.Path)
	}
}
