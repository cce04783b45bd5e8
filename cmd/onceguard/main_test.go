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
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/testproc"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr bool
	}{
		{"version", []string{"version"}, modulePath + " " + version, false},
		{"unknown command", []string{"nope"}, "", true},
		{"bad flag", []string{"serve", "--nope"}, "", true},
		{"bad max amount", []string{"serve", "--max-amount", "1e9"}, "", true},
		{"bad db url", []string{"serve", "--db", "oracle://x"}, "", true},
		{"max amount past the limit", []string{"serve", "--max-amount", "90000000000000000.00", "--addr", "127.0.0.1:0"}, "", true},
		{"unknown submit token purpose", []string{"serve", "--require-submit-token", "withdrawl", "--addr", "127.0.0.1:0"}, "", true},
		{"psp callbacks without a secret", []string{"psp", "--addr", "127.0.0.1:0", "--notify", "http://127.0.0.1:1/cb"}, "", true},
		{"psp callbacks to no http URL", []string{"psp", "--addr", "127.0.0.1:0", "--notify", "ftp://x/cb", "--notify-secret", "s"}, "", true},
		{"psp settling after nothing", []string{"psp", "--addr", "127.0.0.1:0", "--async", "--settle-after", "0s"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			// Bounded: a serve that starts instead of refusing its flags
			// stops (without error) and fails the case.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := run(ctx, tc.args, func(string) string { return "" }, &out, &errOut)
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

// commandFlags defines cmd's flags on env, as run does.
func commandFlags(t *testing.T, cmd string, env *envVars) *flag.FlagSet {
	t.Helper()
	switch cmd {
	case "serve":
		fs, _ := serveFlags(env, io.Discard)
		return fs
	case "psp":
		fs, _ := pspFlags(env, io.Discard)
		return fs
	case "storm":
		fs, _, _ := stormFlags(env, io.Discard)
		return fs
	case "gateway":
		fs, _ := gatewayFlags(env, io.Discard)
		return fs
	}
	t.Fatalf("no command %q", cmd)
	return nil
}

// A flag given on the command line wins over its environment variable,
// which wins over the built-in default: a variable that does not parse is
// no error when its flag is given (the flag's value is used), and still
// one, naming it, when its flag is not given, even with other flags given.
func TestEnvFlagPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cmd     string
		env     map[string]string
		args    []string
		want    map[string]string // flag -> value after parsing
		wantErr []string          // variables the error names; none: no error
		notErr  []string          // variables the error must not name
	}{
		{name: "malformed env, flag given", cmd: "serve", env: map[string]string{"ONCEGUARD_LOCK_TTL": "10"},
			args: []string{"--lock-ttl", "3s"}, want: map[string]string{"lock-ttl": "3s"}},
		{name: "malformed env, flag given with =", cmd: "serve", env: map[string]string{"ONCEGUARD_RATE_LIMIT": "fast"},
			args: []string{"--rate-limit=7.5"}, want: map[string]string{"rate-limit": "7.5"}},
		{name: "malformed env, flag given its default", cmd: "serve", env: map[string]string{"ONCEGUARD_DB_CONNS": "20.5"},
			args: []string{"-db-conns", "20"}, want: map[string]string{"db-conns": "20"}},
		{name: "malformed env, no flag", cmd: "serve", env: map[string]string{"ONCEGUARD_LOCK_TTL": "10"},
			wantErr: []string{"ONCEGUARD_LOCK_TTL"}},
		{name: "malformed env, another flag given", cmd: "serve", env: map[string]string{"ONCEGUARD_LOCK_TTL": "10"},
			args: []string{"--token-ttl", "1m"}, wantErr: []string{"ONCEGUARD_LOCK_TTL"}},
		{name: "two malformed, one flag given", cmd: "serve", env: map[string]string{"ONCEGUARD_LOCK_TTL": "10", "ONCEGUARD_RATE_BURST": "many"},
			args: []string{"--lock-ttl", "3s"}, wantErr: []string{"ONCEGUARD_RATE_BURST"}, notErr: []string{"ONCEGUARD_LOCK_TTL"}},
		{name: "valid env, flag given", cmd: "serve", env: map[string]string{"ONCEGUARD_LOCK_TTL": "4s", "ONCEGUARD_ADDR": "127.0.0.1:1", "ONCEGUARD_RATE_LIMIT": "9"},
			args: []string{"--lock-ttl", "3s", "--addr", "127.0.0.1:2"}, want: map[string]string{"lock-ttl": "3s", "addr": "127.0.0.1:2", "rate-limit": "9"}},
		{name: "valid env, no flag", cmd: "serve", env: map[string]string{"ONCEGUARD_LOCK_TTL": "4s"},
			want: map[string]string{"lock-ttl": "4s", "token-ttl": "5m0s"}},
		{name: "storm: malformed env, flags given", cmd: "storm",
			env:  map[string]string{"ONCEGUARD_STORM_N": "fifty", "ONCEGUARD_STORM_TIMEOUT": "120", "ONCEGUARD_STORM_JSON": "yes please"},
			args: []string{"--n", "5", "--timeout", "1m", "--json=false"}, want: map[string]string{"n": "5", "timeout": "1m0s", "json": "false"}},
		{name: "storm: malformed env, no flag", cmd: "storm", env: map[string]string{"ONCEGUARD_STORM_N": "fifty", "ONCEGUARD_STORM_JSON": "yes please"},
			args: []string{"--json"}, wantErr: []string{"ONCEGUARD_STORM_N"}, notErr: []string{"ONCEGUARD_STORM_JSON"}},
		{name: "storm: valid env, flag given", cmd: "storm", env: map[string]string{"ONCEGUARD_STORM_N": "40", "ONCEGUARD_STORM_JSON": "true"},
			args: []string{"--n", "6"}, want: map[string]string{"n": "6", "json": "true"}},
		{name: "psp: valid env, flag given", cmd: "psp", env: map[string]string{"ONCEGUARD_PSP_ADDR": "127.0.0.1:1"},
			args: []string{"--addr", "127.0.0.1:2"}, want: map[string]string{"addr": "127.0.0.1:2"}},
		// One variable holds the callbacks' secret for both sides: the
		// provider signs with it, the service verifies with it.
		{name: "serve: the shared callback secret", cmd: "serve", env: map[string]string{"ONCEGUARD_PSP_NOTIFY_SECRET": "whsec_shared"},
			want: map[string]string{"psp-notify-secret": "whsec_shared"}},
		{name: "psp: the shared callback secret", cmd: "psp", env: map[string]string{"ONCEGUARD_PSP_NOTIFY_SECRET": "whsec_shared"},
			want: map[string]string{"notify-secret": "whsec_shared"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := &envVars{getenv: func(n string) string { return tc.env[n] }}
			fs := commandFlags(t, tc.cmd, env)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatalf("parse %q: %v", tc.args, err)
			}
			err := env.err(fs)
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("env %v, flags %q: %v; want no error", tc.env, tc.args, err)
			}
			if len(tc.wantErr) > 0 && err == nil {
				t.Fatalf("env %v, flags %q: no error; want one naming %v", tc.env, tc.args, tc.wantErr)
			}
			for _, name := range tc.wantErr {
				if !strings.Contains(err.Error(), name+"=") || !strings.Contains(err.Error(), tc.env[name]) {
					t.Errorf("error %q; want it to name %s and its value %q", err, name, tc.env[name])
				}
			}
			for _, name := range tc.notErr {
				if err != nil && strings.Contains(err.Error(), name) {
					t.Errorf("error %q names %s, whose flag was given or whose value parsed", err, name)
				}
			}
			for name, want := range tc.want {
				if got := fs.Lookup(name).Value.String(); got != want {
					t.Errorf("--%s = %q; want %q", name, got, want)
				}
			}
		})
	}
}

// Every flag of every command, its variable set to a value that does not
// parse: an error naming the variable (for a flag whose type can refuse
// the value) without the flag, none with it, the flag's value then used.
func TestEnvFlagPrecedenceEveryFlag(t *testing.T) {
	const bad = "not-a-value"
	none := &envVars{getenv: func(string) string { return "" }}
	for _, cmd := range []string{"serve", "psp", "storm"} {
		commandFlags(t, cmd, none).VisitAll(func(f *flag.Flag) {
			name := flagEnv(f)
			if name == "" {
				t.Errorf("%s --%s: flagEnv finds no variable in its usage %q", cmd, f.Name, f.Usage)
				return
			}
			fresh := reflect.New(reflect.TypeOf(f.Value).Elem()).Interface().(flag.Value)
			refuses := fresh.Set(bad) != nil
			getenv := func(n string) string {
				if n == name {
					return bad
				}
				return ""
			}

			env := &envVars{getenv: getenv}
			fs := commandFlags(t, cmd, env)
			if err := fs.Parse(nil); err != nil {
				t.Fatal(err)
			}
			if err := env.err(fs); refuses && (err == nil || !strings.Contains(err.Error(), name)) {
				t.Errorf("%s, %s=%q, no flag: %v; want an error naming %s", cmd, name, bad, err, name)
			} else if !refuses && err != nil {
				t.Errorf("%s, %s=%q, no flag: %v; want none (the value is a string)", cmd, name, bad, err)
			}

			env = &envVars{getenv: getenv}
			fs = commandFlags(t, cmd, env)
			if err := fs.Parse([]string{"--" + f.Name + "=" + f.DefValue}); err != nil {
				t.Fatal(err)
			}
			if err := env.err(fs); err != nil {
				t.Errorf("%s, %s=%q, --%s=%s given: %v; want none (the flag wins)", cmd, name, bad, f.Name, f.DefValue, err)
			}
			if got := fs.Lookup(f.Name).Value.String(); got != f.DefValue {
				t.Errorf("%s --%s=%s given: value %q", cmd, f.Name, f.DefValue, got)
			}
		})
	}
}

// End to end: serve starts with a malformed variable whose flag is given,
// and the storm gets past its configuration (to the unreachable target).
func TestRunEnvOverriddenByFlag(t *testing.T) {
	getenv := func(n string) string {
		return map[string]string{"ONCEGUARD_LOCK_TTL": "10", "ONCEGUARD_RATE_LIMIT": "fast", "ONCEGUARD_STORM_N": "fifty"}[n]
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--data-dir", t.TempDir(), "--addr", "127.0.0.1:0", "--lock-ttl", "2s", "--rate-limit", "100"}, getenv, out, io.Discard)
	}()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "listening"); {
		select {
		case err := <-done:
			t.Fatalf("serve with its flags over malformed variables = %v; want it to start", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve after cancel = %v; want nil", err)
	}

	err := run(context.Background(), []string{"storm", "--target", "http://127.0.0.1:1", "--n", "5", "--timeout", "10s"}, getenv, io.Discard, io.Discard)
	if err == nil || strings.Contains(err.Error(), "ONCEGUARD_STORM_N") || !strings.Contains(err.Error(), "cannot reach the service") {
		t.Errorf("storm --n 5 with ONCEGUARD_STORM_N=fifty = %v; want past the configuration, to the unreachable target", err)
	}
}

// The configuration table of docs/operations.md is every command's flags: each row
// names a flag of its command with the variable its usage names and its
// real default, and every flag has its row.
func TestConfigTable(t *testing.T) {
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ env, def string }
	table := map[string]row{} // "command --flag" -> row
	in := false
	for line := range strings.SplitSeq(string(raw), "\n") {
		if strings.HasPrefix(line, "| command | flag | env | default |") {
			if in || len(table) > 0 {
				t.Fatal("docs/operations.md has two configuration tables; want one")
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
			t.Errorf("docs/operations.md row %q: want command, flag, env, default, meaning", line)
			continue
		}
		key := strings.Trim(strings.TrimSpace(cells[0]), "`") + " " + strings.Trim(cells[1], "`")
		if _, dup := table[key]; dup {
			t.Errorf("docs/operations.md has two rows for %s", key)
		}
		table[key] = row{env: strings.Trim(cells[2], "`"), def: cells[3]}
	}
	if len(table) == 0 {
		t.Fatal("docs/operations.md has no configuration table (| command | flag | env | default | meaning |)")
	}
	none := &envVars{getenv: func(string) string { return "" }}
	serveFS, _ := serveFlags(none, io.Discard)
	pspFS, _ := pspFlags(none, io.Discard)
	stormFS, _, _ := stormFlags(none, io.Discard)
	gatewayFS, _ := gatewayFlags(none, io.Discard)
	envRE := regexp.MustCompile(`\[(ONCEGUARD_[A-Z0-9_]+)\]$`)
	seen := map[string]bool{}
	for cmd, fs := range map[string]*flag.FlagSet{"serve": serveFS, "psp": pspFS, "storm": stormFS, "gateway": gatewayFS} {
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
				t.Errorf("%s (%s, default %q) has no row in docs/operations.md's configuration table", key, m[1], f.DefValue)
				return
			}
			if r.env != m[1] {
				t.Errorf("%s: docs/operations.md says %s; the flag reads %s", key, r.env, m[1])
			}
			if !sameDefault(f, r.def) {
				t.Errorf("%s: docs/operations.md says the default is %s; it is %q", key, r.def, f.DefValue)
			}
		})
	}
	for key := range table {
		if !seen[key] {
			t.Errorf("docs/operations.md's configuration table has a row for %s, which is no flag", key)
		}
	}
}

// sameDefault tells whether cell, the table's default for f, is f's
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

// syncBuffer collects a command's output while the test reads it.
type syncBuffer = testproc.Buffer
