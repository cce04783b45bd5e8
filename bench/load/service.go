package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/onceguard/onceguard/internal/testproc"
)

// user is one client of the load: its own account, signed in once.
type user struct {
	idx             int
	name, id, token string
	// sent counts the withdrawals sent (it makes every body and key of the
	// user distinct); deposits the deposits made.
	sent, deposits int64
	// balance is what the client expects the balance to be (cents):
	// deposits that answered succeeded minus withdrawals that answered 201
	// succeeded. uncertain counts withdrawals without a definite answer (a
	// transport error, a 5xx, a 201 pending), after which the expectation
	// may be off by their amounts.
	balance   int64
	uncertain int64
}

const (
	depositCents = 100_000_000 // 1000000.00, the deposit per top-up (--max-amount's default)
	topUpBelow   = 60_000_000  // top up before a cell when the expected balance is below this
	amountCycle  = 10_000      // withdrawal amounts go 0.01, 0.02, … 100.00, then start again
)

// serviceConfig is one configuration of the service (SQLite, or
// PostgreSQL + Redis): a child process started afresh every round on the
// same data, and its users, signed up in the first round.
type serviceConfig struct {
	group, bin, runID string
	args              []string
	logPath           string
	redis             *redisAdmin // nil: SQLite
	tokens            tokenMode   // where each withdrawal's key comes from
	users             []*user

	pg     *pgAdmin // the PostgreSQL configuration: its database's counters
	dbName string
	proxy  *pgProxy // between it and PostgreSQL: its round trips; nil: none
	// sqlitePath is its SQLite database, whose write transactions
	// walCommits counts; "" for PostgreSQL.
	sqlitePath string

	proc      *serviceProc
	notes     []string // what looked wrong: exits, balance mismatches
	workNotes []string // database work per withdrawal, per round
}

type serviceProc struct {
	cmd     *exec.Cmd
	base    string
	pid     int
	done    chan struct{}
	waitErr error
	log     *os.File
}

// addrWatcher passes the child's stdout to w and reports the address of
// its "listening on http://ADDR;" line.
type addrWatcher struct {
	w     io.Writer
	mu    sync.Mutex
	buf   []byte
	found chan string
	sent  bool
}

func (a *addrWatcher) Write(p []byte) (int, error) {
	a.mu.Lock()
	if !a.sent {
		a.buf = append(a.buf, p...)
		const marker = "listening on http://"
		if i := bytes.Index(a.buf, []byte(marker)); i >= 0 {
			rest := a.buf[i+len(marker):]
			if j := bytes.IndexAny(rest, "; \n"); j >= 0 {
				a.found <- string(rest[:j])
				a.sent, a.buf = true, nil
			}
		}
	}
	a.mu.Unlock()
	return a.w.Write(p)
}

// start runs the service and waits until it listens; when names the run
// ("round 2", "paired blocks") in its log.
func (s *serviceConfig) start(ctx context.Context, when string) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== %s: %s %s\n", when, s.bin, strings.Join(quoteArgs(s.args), " "))
	w := &addrWatcher{w: logf, found: make(chan string, 1)}
	cmd := exec.Command(s.bin, s.args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "ONCEGUARD_") { // only the flags configure it
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Stdout, cmd.Stderr = w, logf
	if err := testproc.Start(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	p := &serviceProc{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), log: logf}
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	s.proc = p
	select {
	case addr := <-w.found:
		p.base = "http://" + addr
		return nil
	case <-p.done:
		s.proc = nil
		logf.Close()
		return fmt.Errorf("%s service exited before listening (%v); log %s:\n%s", s.group, p.waitErr, s.logPath, tail(s.logPath, 20))
	case <-time.After(60 * time.Second):
		s.stopQuietly()
		return fmt.Errorf("%s service did not listen within 60s; log %s:\n%s", s.group, s.logPath, tail(s.logPath, 20))
	case <-ctx.Done():
		s.stopQuietly()
		return ctx.Err()
	}
}

// stop sends SIGTERM and waits (20 s, then SIGKILL); a graceful stop
// exits 0 (docs/api.md, "Process"), anything else is noted under when.
func (s *serviceConfig) stop(when string) {
	p := s.proc
	if p == nil {
		return
	}
	s.proc = nil
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t0 := time.Now()
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		s.notes = append(s.notes, when+": the service did not exit within 20s of SIGTERM; killed")
	}
	if p.waitErr != nil {
		s.notes = append(s.notes, fmt.Sprintf("%s: the service exited with %v after SIGTERM (want exit status 0)", when, p.waitErr))
	}
	fmt.Fprintf(p.log, "=== stopped after %v: %v\n", time.Since(t0).Round(time.Millisecond), errString(p.waitErr))
	p.log.Close()
}

// stopQuietly is the cleanup path: kill whatever still runs.
func (s *serviceConfig) stopQuietly() {
	if p := s.proc; p != nil {
		s.proc = nil
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		p.log.Close()
	}
}

// roundRun starts the service, signs up the users in the first round,
// runs one cell per client count, checks every user's balance and stops
// the service.
func (s *serviceConfig) roundRun(ctx context.Context, round int, order []int, maxClients int, cfg config, rep *report, progress io.Writer) error {
	t0 := time.Now()
	var before dbStats
	if s.pg != nil {
		before = s.pg.stats(s.dbName)
	}
	rt0 := s.proxy.counts()
	sentBefore := int64(0)
	for _, u := range s.users {
		sentBefore += u.sent
	}
	when := fmt.Sprintf("round %d", round+1)
	if err := s.start(ctx, when); err != nil {
		return err
	}
	defer s.stop(when) // on an error; a no-op after the stop below
	a := newAPI(s.proc.base, maxClients)
	defer a.hc.CloseIdleConnections()
	var wal0 uint32
	var wb0 int64
	walOK, wbOK := false, false
	if s.sqlitePath != "" {
		wal0, walOK = walCommits(s.sqlitePath)
		wb0, wbOK = pidWriteBytes(s.proc.pid)
	}
	fmt.Fprintf(progress, "round %d  %-20s started in %v (pid %d, %s)\n", round+1, groupLabels[s.group], time.Since(t0).Round(time.Millisecond), s.proc.pid, s.proc.base)
	if s.users == nil {
		t1 := time.Now()
		users, err := setupUsers(ctx, a, s.runID, maxClients)
		if err != nil {
			return fmt.Errorf("%s: setting up users: %w", s.group, err)
		}
		s.users = users
		fmt.Fprintf(progress, "round %d  %-20s %d users signed up, signed in and funded in %v\n", round+1, groupLabels[s.group], maxClients, time.Since(t1).Round(time.Millisecond))
	}
	for _, n := range order {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := topUp(ctx, a, s.users[:n]); err != nil {
			return fmt.Errorf("%s: top-up deposits: %w", s.group, err)
		}
		probe := cpuProbe{svcPID: s.proc.pid, pg: s.pg != nil, redis: s.redis, proxy: s.proxy, xid: s.pg}
		r := runCell(ctx, a, s.users[:n], cfg.warmup, cfg.duration, probe, s.tokens)
		if ctx.Err() != nil {
			return ctx.Err() // interrupted: the cell is left out
		}
		rep.add(s.group, n, r)
		fmt.Fprintf(progress, "round %d  %-20s %3d clients  %s\n", round+1, groupLabels[s.group], n, r.progressLine())
	}
	s.checkBalances(ctx, a, when)
	a.hc.CloseIdleConnections()
	var wal1 uint32
	var wb1 int64
	if walOK {
		wal1, walOK = walCommits(s.sqlitePath)
	}
	if wbOK {
		wb1, wbOK = pidWriteBytes(s.proc.pid)
	}
	s.stop(when)
	sent := int64(0)
	for _, u := range s.users {
		sent += u.sent
	}
	sent -= sentBefore
	if sent <= 0 {
		return nil
	}
	w := float64(sent)
	tail := fmt.Sprintf(" per withdrawal sent (%d withdrawals among %d requests in the round%s)",
		sent, a.reqs.Load(), map[bool]string{true: ", sign-ups and first deposits included", false: ""}[round == 0])
	switch {
	case s.pg != nil:
		after := s.pg.stats(s.dbName)
		if before.ok && after.ok {
			s.workNotes = append(s.workNotes, fmt.Sprintf("round %d: %s%s", round+1, pgWork(before, after, rt0, s.proxy.counts(), w), tail))
		}
	case s.sqlitePath != "":
		if walOK {
			written := ""
			if wbOK {
				// The WAL's frames and the checkpoints' copies of them: the pages a withdrawal dirties.
				written = fmt.Sprintf(", %.1f KiB written to disk (its process's write_bytes: WAL and checkpoints)", float64(wb1-wb0)/1024/w)
			}
			s.workNotes = append(s.workNotes, fmt.Sprintf("round %d: %.2f commits (write transactions, from the WAL index)%s%s", round+1, float64(wal1-wal0)/w, written, tail))
		} else {
			s.workNotes = append(s.workNotes, fmt.Sprintf("round %d: commits not measured (no readable wal-index %s-shm)", round+1, s.sqlitePath))
		}
	}
	return nil
}

// pgWork is a PostgreSQL contender's work between two readings of its
// database's counters and its proxy's, per n withdrawals (transactions).
func pgWork(before, after dbStats, rt0, rt1 proxyCounts, n float64) string {
	s := fmt.Sprintf("%.2f commits, %.2f rollbacks, %.2f rows inserted, %.2f updated, %.2f deleted",
		float64(after.commits-before.commits)/n, float64(after.rollbacks-before.rollbacks)/n,
		float64(after.inserted-before.inserted)/n, float64(after.updated-before.updated)/n, float64(after.deleted-before.deleted)/n)
	if rt0.ok && rt1.ok {
		s += fmt.Sprintf(", %.2f round trips", float64(rt1.roundTrips()-rt0.roundTrips())/n)
		if b := rt1.broken - rt0.broken; b > 0 {
			s += fmt.Sprintf(" (%d connection(s) not parsed: uncounted)", b)
		}
	}
	return s
}

// setupUsers signs up n users, signs each in and deposits 1000000.00.
func setupUsers(ctx context.Context, a *api, runID string, n int) ([]*user, error) {
	users := make([]*user, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4) // password hashing is slow: a few at a time
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			u := &user{idx: i, name: fmt.Sprintf("ld_%s_%d", runID, i)}
			password := "load-password-" + runID
			creds, _ := json.Marshal(map[string]string{"username": u.name, "password": password})
			st, body, err := a.do(ctx, http.MethodPost, "/api/v1/users", "", "", creds)
			if err != nil || st != http.StatusCreated {
				errs[i] = fmt.Errorf("POST /api/v1/users: %d %s %v", st, body, err)
				return
			}
			var created struct{ ID string }
			if err := json.Unmarshal(body, &created); err != nil || created.ID == "" {
				errs[i] = fmt.Errorf("POST /api/v1/users: bad answer %s", body)
				return
			}
			u.id = created.ID
			st, body, err = a.do(ctx, http.MethodPost, "/api/v1/sessions", "", "", creds)
			if err != nil || st != http.StatusCreated {
				errs[i] = fmt.Errorf("POST /api/v1/sessions: %d %s %v", st, body, err)
				return
			}
			var sess struct{ Token string }
			if err := json.Unmarshal(body, &sess); err != nil || sess.Token == "" {
				errs[i] = fmt.Errorf("POST /api/v1/sessions: bad answer %s", body)
				return
			}
			u.token = sess.Token
			if err := deposit(ctx, a, u); err != nil {
				errs[i] = err
				return
			}
			users[i] = u
		}()
	}
	wg.Wait()
	return users, errors.Join(errs...)
}

// deposit credits 1000000.00 under a fresh key.
func deposit(ctx context.Context, a *api, u *user) error {
	u.deposits++
	key := fmt.Sprintf("ld-dep-%d", u.deposits)
	st, body, err := a.do(ctx, http.MethodPost, "/api/v1/deposits", u.token, key, []byte(`{"amount":"1000000.00"}`))
	if err != nil || st != http.StatusCreated || !bytes.Contains(body, []byte(`"status":"succeeded"`)) {
		return fmt.Errorf("POST /api/v1/deposits for %s: %d %s %v", u.name, st, body, err)
	}
	u.balance += depositCents
	return nil
}

// topUp deposits again for the users whose balance is running low, so
// that no withdrawal of a cell meets insufficient_funds.
func topUp(ctx context.Context, a *api, users []*user) error {
	for _, u := range users {
		if u.balance < topUpBelow {
			if err := deposit(ctx, a, u); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkBalances compares each user's balance (GET /api/v1/account) with
// what the answers it got imply; a difference is noted under when.
func (s *serviceConfig) checkBalances(ctx context.Context, a *api, when string) {
	bad := 0
	var first string
	for _, u := range s.users {
		st, body, err := a.do(ctx, http.MethodGet, "/api/v1/account", u.token, "", nil)
		if err != nil || st != http.StatusOK {
			bad++
			if first == "" {
				first = fmt.Sprintf("GET /api/v1/account of %s: %d %s %v", u.name, st, body, err)
			}
			continue
		}
		var acc struct{ Balance string }
		_ = json.Unmarshal(body, &acc)
		got, ok := parseCents(acc.Balance)
		if !ok || got != u.balance {
			bad++
			if first == "" {
				first = fmt.Sprintf("%s: balance %s, the answers imply %s (%d withdrawals without a definite answer)", u.name, acc.Balance, fmtCents(u.balance), u.uncertain)
			}
		}
	}
	if bad > 0 {
		s.notes = append(s.notes, fmt.Sprintf("%s: %d of %d users' balances differ from what the answers imply; first: %s", when, bad, len(s.users), first))
	}
}

// logLines returns the service's output other than its start line and
// this command's markers: errors it logged under load, if any.
func (s *serviceConfig) logLines() []string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "=== ") || strings.Contains(l, "listening on http://") || strings.TrimSpace(l) == "" {
			continue
		}
		// The service's info lines (one per request, one audit line per
		// withdrawal: its default logging, kept on while measuring) are
		// expected; warnings, errors and anything not JSON are not.
		if strings.HasPrefix(l, `{"time":`) && (strings.Contains(l, `"level":"INFO"`) || strings.Contains(l, `"level":"DEBUG"`)) {
			continue
		}
		lines = append(lines, l)
	}
	return lines
}

// cleanupRedis deletes the service's lock records of this run's users on
// the shared Redis (the lock keys are released, but redislock keeps a
// fence record per lock for an hour); the repeat-window entries expire
// after 10 s by themselves.
func (s *serviceConfig) cleanupRedis(progress io.Writer) {
	if s.redis == nil || len(s.users) == 0 {
		return
	}
	var keys []string
	for _, u := range s.users {
		if u == nil {
			continue
		}
		base := "onceguard:lock:{user:" + u.id + "}"
		keys = append(keys, base, base+":fence", base+":q", base+":qx")
	}
	n, err := s.redis.unlink(keys)
	if err != nil {
		fmt.Fprintf(progress, "cleanup of the service's Redis keys: %v\n", err)
		return
	}
	fmt.Fprintf(progress, "cleanup: deleted %d Redis keys of this run's users\n", n)
}

// api is the HTTP client of one service process.
type api struct {
	base string
	hc   *http.Client
	reqs atomic.Int64 // requests sent
}

func newAPI(base string, clients int) *api {
	tr := &http.Transport{
		MaxIdleConns:        2 * clients,
		MaxIdleConnsPerHost: 2 * clients, // every client keeps its connection
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &api{base: base, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

func (a *api) do(ctx context.Context, method, path, token, key string, body []byte) (int, []byte, error) {
	st, b, _, err := a.send(ctx, method, path, token, key, body)
	return st, b, err
}

// send is do that also returns the answer's headers.
func (a *api) send(ctx context.Context, method, path, token, key string, body []byte) (int, []byte, http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header["Content-Type"] = []string{"application/json"}
	}
	if token != "" {
		req.Header["Authorization"] = []string{"Bearer " + token}
	}
	if key != "" {
		req.Header["Idempotency-Key"] = []string{key}
	}
	a.reqs.Add(1)
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header, err
}

// parseCents reads a contract amount ("123.45", exactly 2 fraction digits).
func parseCents(s string) (int64, bool) {
	whole, frac, ok := strings.Cut(s, ".")
	if !ok || len(frac) != 2 || whole == "" {
		return 0, false
	}
	w, err1 := strconv.ParseInt(whole, 10, 64)
	f, err2 := strconv.ParseInt(frac, 10, 64)
	if err1 != nil || err2 != nil || w < 0 || f < 0 {
		return 0, false
	}
	return w*100 + f, true
}

func fmtCents(c int64) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = fmt.Sprintf("%q", a)
		}
		out[i] = a
	}
	return out
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func errString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
