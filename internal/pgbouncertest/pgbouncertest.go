// Package pgbouncertest runs a private PgBouncer in transaction pooling mode in
// front of the PostgreSQL server of ONCEGUARD_TEST_POSTGRES, for tests that
// show a package is safe behind one (docs/pitfalls.md, item 9): in that mode
// a client's statements outside a transaction may each run on another
// server connection, and one server connection serves many clients in turn,
// so anything a package leaves on a session (an advisory lock, a prepared
// statement, a SET) is lost or seen by a stranger.
//
// The process listens on a free loopback port, keeps its configuration in a
// test temporary directory and is killed when the test ends.
package pgbouncertest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/testproc"
)

// startAttempts is how many free ports Start tries when another process
// takes the port between its choice and PgBouncer's bind.
const startAttempts = 5

// Config is what Start runs.
type Config struct {
	// Pool is the most server connections PgBouncer opens (its
	// default_pool_size); at least 1.
	Pool int
	// Database is the database of ONCEGUARD_TEST_POSTGRES's server to
	// serve; "" for the URL's own.
	Database string
	// IgnoreStartupParameters are accepted from clients and dropped (with
	// extra_float_digits, always), as PgBouncer's ignore_startup_parameters.
	IgnoreStartupParameters []string
}

// Start starts PgBouncer in transaction pooling mode in front of the
// server of ONCEGUARD_TEST_POSTGRES, as c says, and returns the URL of its
// clients (for pgx); the process is killed when t ends. The URL asks for
// pgx's exec query mode (default_query_exec_mode=exec: unnamed
// statements, each parsed in the round trip that runs it), which is what a
// user behind PgBouncer before 1.21 must configure: pgx's default caches
// named prepared statements per connection, which transaction pooling
// does not keep.
//
// Start skips the test when ONCEGUARD_TEST_POSTGRES is unset, and when
// pgbouncer is not installed unless the environment variable CI is set,
// where it fails the test instead.
func Start(t testing.TB, c Config) string {
	t.Helper()
	if os.Getenv("ONCEGUARD_TEST_POSTGRES") == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set; skipping the PgBouncer test")
	}
	bin := testproc.LookPath("pgbouncer")
	if bin == "" {
		msg := "pgbouncer is not installed (apt-get install pgbouncer)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; failing instead of skipping because CI is set")
		}
		t.Skip(msg)
	}
	server, err := url.Parse(os.Getenv("ONCEGUARD_TEST_POSTGRES"))
	if err != nil {
		t.Fatalf("ONCEGUARD_TEST_POSTGRES: %v", err)
	}
	if c.Database != "" {
		server.Path = "/" + c.Database
	}
	dir := t.TempDir()
	// PgBouncer refuses to run as root; as root it is started as nobody,
	// who must read its configuration.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var failures []string
	for attempt := 1; attempt <= startAttempts; attempt++ {
		dsn, clash, err := start(t, bin, dir, server, c)
		if err == nil {
			return dsn
		}
		failures = append(failures, fmt.Sprintf("attempt %d: %v", attempt, err))
		if !clash {
			break
		}
	}
	t.Fatalf("pgbouncer: starting failed:\n%s", strings.Join(failures, "\n"))
	return ""
}

// start starts one PgBouncer on a free port and waits until it says it
// listens; it returns the URL of its clients. clash reports that the port was
// taken, so that another may work.
func start(t testing.TB, bin, dir string, server *url.URL, c Config) (dsn string, clash bool, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", false, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	database := strings.TrimPrefix(server.Path, "/")
	target := fmt.Sprintf("host=%s port=%s dbname=%s user=%s", server.Hostname(), portOf(server), database, server.User.Username())
	if pw, ok := server.User.Password(); ok {
		target += " password=" + pw
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	conf := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
ignore_startup_parameters = %s
`, database, target, port, max(c.Pool, 1), strings.Join(append([]string{"extra_float_digits"}, c.IgnoreStartupParameters...), ","))
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		return "", false, err
	}
	args := []string{ini}
	if os.Geteuid() == 0 {
		args = []string{"-u", "nobody", ini}
	}
	var log testproc.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = &log
	cmd.Stderr = &log
	if err := testproc.Start(cmd); err != nil {
		return "", false, fmt.Errorf("exec %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	dsn = fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=exec", server.User.Username(), port, database)
	listening := fmt.Sprintf("listening on 127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			out := log.String()
			return "", strings.Contains(out, "in use"), fmt.Errorf("pgbouncer exited:\n%s", out)
		default:
		}
		if strings.Contains(log.String(), listening) {
			return dsn, false, nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return "", false, fmt.Errorf("pgbouncer not listening after 10 s:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return "5432"
}
