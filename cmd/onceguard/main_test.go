package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/psp"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr bool
	}{
		{"version", []string{"version"}, "onceguard " + version, false},
		{"unknown command", []string{"nope"}, "", true},
		{"bad flag", []string{"serve", "--nope"}, "", true},
		{"bad max amount", []string{"serve", "--max-amount", "1e9"}, "", true},
		{"bad db url", []string{"serve", "--db", "oracle://x"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errOut)
			if (err != nil) != tc.wantErr {
				t.Fatalf("run(%q) = %v; want error %v", tc.args, err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("run(%q) printed %q; want it to contain %q", tc.args, out.String(), tc.want)
			}
		})
	}
}

// An environment variable that is set but does not parse is an error at
// start that names it, never the default in silence.
func TestRunBadEnvironment(t *testing.T) {
	for _, tc := range []struct {
		cmd, name, value string
	}{
		{"serve", "ONCEGUARD_LOCK_TTL", "10"},
		{"serve", "ONCEGUARD_TOKEN_TTL", "five minutes"},
		{"serve", "ONCEGUARD_RECONCILE_INTERVAL", "5"},
		{"serve", "ONCEGUARD_DB_CONNS", "20.5"},
		{"serve", "ONCEGUARD_RATE_BURST", "many"},
		{"serve", "ONCEGUARD_LOGIN_ATTEMPTS", "5x"},
		{"serve", "ONCEGUARD_RATE_LIMIT", "fast"},
		{"storm", "ONCEGUARD_STORM_N", "fifty"},
		{"storm", "ONCEGUARD_STORM_TIMEOUT", "120"},
		{"storm", "ONCEGUARD_STORM_JSON", "yes please"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			getenv := func(n string) string {
				if n == tc.name {
					return tc.value
				}
				return ""
			}
			// A data dir and an address of the test's, should serve start
			// after all; the storm's target does not listen.
			args := []string{tc.cmd, "--data-dir", t.TempDir(), "--addr", "127.0.0.1:0"}
			if tc.cmd == "storm" {
				args = []string{tc.cmd, "--target", "http://127.0.0.1:1"}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := run(ctx, args, getenv, &out, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.value) || strings.Contains(out.String(), "listening") {
				t.Errorf("run with %s=%q = %v (printed %q); want an error naming the variable and its value, before anything starts", tc.name, tc.value, err, out.String())
			}
		})
	}
	// Set and well formed: used.
	fs, c := serveFlags(&envVars{getenv: func(n string) string {
		return map[string]string{"ONCEGUARD_LOCK_TTL": "3s", "ONCEGUARD_RATE_LIMIT": "7.5", "ONCEGUARD_DB_CONNS": "4"}[n]
	}}, io.Discard)
	if err := fs.Parse(nil); err != nil || c.lockTTL != 3*time.Second || c.rateLimit != 7.5 || c.dbConns != 4 {
		t.Errorf("from the environment: lock TTL %v, rate limit %v, db conns %d (%v); want 3s, 7.5, 4", c.lockTTL, c.rateLimit, c.dbConns, err)
	}
}

// The README's configuration table is every command's flags: each row
// names a flag of its command with the variable its usage names and its
// real default, and every flag has its row.
func TestConfigTable(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ env, def string }
	table := map[string]row{} // "command --flag" -> row
	in := false
	for line := range strings.SplitSeq(string(raw), "\n") {
		if strings.HasPrefix(line, "| command | flag | env | default |") {
			if in || len(table) > 0 {
				t.Fatal("README has two configuration tables; want one")
			}
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if strings.HasPrefix(cells[0], " ---") {
			continue
		}
		if len(cells) < 5 {
			t.Errorf("README row %q: want command, flag, env, default, meaning", line)
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[0]), "`") + " " + strings.Trim(cells[1], "`")
		if _, dup := table[key]; dup {
			t.Errorf("README has two rows for %s", key)
		}
		table[key] = row{env: strings.Trim(cells[2], "`"), def: cells[3]}
	}
	if len(table) == 0 {
		t.Fatal("README has no configuration table (| command | flag | env | default | meaning |)")
	}
	none := &envVars{getenv: func(string) string { return "" }}
	serveFS, _ := serveFlags(none, io.Discard)
	pspFS, _ := pspFlags(none, io.Discard)
	stormFS, _, _ := stormFlags(none, io.Discard)
	envRE := regexp.MustCompile(`\[(ONCEGUARD_[A-Z0-9_]+)\]$`)
	seen := map[string]bool{}
	for cmd, fs := range map[string]*flag.FlagSet{"serve": serveFS, "psp": pspFS, "storm": stormFS} {
		fs.VisitAll(func(f *flag.Flag) {
			key := cmd + " --" + f.Name
			seen[key] = true
			m := envRE.FindStringSubmatch(f.Usage)
			if m == nil {
				t.Errorf("%s: its usage names no environment variable [ONCEGUARD_...]", key)
				return
			}
			r, ok := table[key]
			if !ok {
				t.Errorf("%s (%s, default %q) has no row in the README's configuration table", key, m[1], f.DefValue)
				return
			}
			if r.env != m[1] {
				t.Errorf("%s: README says %s; the flag reads %s", key, r.env, m[1])
			}
			if !sameDefault(f, r.def) {
				t.Errorf("%s: README says the default is %s; it is %q", key, r.def, f.DefValue)
			}
		})
	}
	for key := range table {
		if !seen[key] {
			t.Errorf("README's configuration table has a row for %s, which is no flag", key)
		}
	}
}

// sameDefault tells whether cell, the README's default for f, is f's
// default: a value in backticks that reads as it (through a new value of
// the flag's own type: "5m" is 5m0s), or words for an empty default
// ("none", "simulated in process").
func sameDefault(f *flag.Flag, cell string) bool {
	v, quoted := strings.CutPrefix(cell, "`")
	if v, quoted = strings.CutSuffix(v, "`"); !quoted || strings.Contains(v, "`") {
		return f.DefValue == "" && cell != "" && !strings.Contains(cell, "`"+"`")
	}
	if v == f.DefValue {
		return true
	}
	fresh, ok := reflect.New(reflect.TypeOf(f.Value).Elem()).Interface().(flag.Value)
	return ok && fresh.Set(v) == nil && fresh.String() == f.DefValue
}

// `onceguard psp` serves the simulator until its context ends.
func TestRunPSP(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"psp", "--addr", "127.0.0.1:0"}, func(string) string { return "" }, out, io.Discard)
	}()
	var url string
	for deadline := time.Now().Add(10 * time.Second); url == ""; {
		if i := strings.Index(out.String(), "http://"); i >= 0 {
			url = strings.TrimSpace(out.String()[i:])
		} else if time.Now().After(deadline) {
			t.Fatal("psp did not say where it listens")
		}
		time.Sleep(10 * time.Millisecond)
	}
	op, err := psp.NewClient(url, nil).Do(context.Background(), psp.Charge, "k", 100)
	if err != nil || op.Status != psp.Succeeded {
		t.Errorf("charge through the served psp = %+v, %v", op, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run(psp) after cancel = %v; want nil", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
