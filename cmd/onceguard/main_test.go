package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	env := map[string]string{"ONCEGUARD_ADDR": "127.0.0.1:9999"}
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr bool
	}{
		{"default is serve", nil, "127.0.0.1:9999", false},
		{"flag beats env", []string{"serve", "--addr", "127.0.0.1:7000"}, "127.0.0.1:7000", false},
		{"version", []string{"version"}, "onceguard " + version, false},
		{"unknown command", []string{"nope"}, "", true},
		{"bad flag", []string{"serve", "--nope"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, func(k string) string { return env[k] }, &out, &errOut)
			if (err != nil) != tc.wantErr {
				t.Fatalf("run(%q) = %v; want error %v", tc.args, err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("run(%q) printed %q; want it to contain %q", tc.args, out.String(), tc.want)
			}
		})
	}
}
