package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceguard/onceguard/internal/testproc"
)

// pgbenchSchema mirrors the service's accounts and ledger tables (the
// columns a withdrawal touches, the CHECKs, the ledger's foreign key,
// UNIQUE(kind, ref) and its per-user index), on an integer account id.
const pgbenchSchema = `
CREATE TABLE accounts (
  aid        INT PRIMARY KEY,
  balance    BIGINT NOT NULL CHECK (balance >= 0),
  version    BIGINT NOT NULL DEFAULT 0,
  updated_at BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE ledger (
  id            BIGSERIAL PRIMARY KEY,
  aid           INT NOT NULL REFERENCES accounts (aid),
  kind          VARCHAR(32) NOT NULL,
  amount        BIGINT NOT NULL,
  balance_after BIGINT NOT NULL CHECK (balance_after >= 0),
  ref           VARCHAR(32) NOT NULL,
  created_at    BIGINT NOT NULL,
  UNIQUE (kind, ref)
);
CREATE INDEX ledger_aid ON ledger (aid, id);
`

// pgbenchScript is one withdrawal as the database sees it at the least:
// each client debits its own account (like each load client is its own
// user) under a balance check and appends one ledger row, in one
// transaction. ref is random (UNIQUE(kind, ref) wants distinct values; a
// collision among 9e18 is not expected).
const pgbenchScript = `\set aid :client_id + 1
\set amount random(1, 10000)
\set neg -:amount
\set ref random(1, 9000000000000000000)
BEGIN;
UPDATE accounts SET balance = balance - :amount, version = version + 1, updated_at = :ref WHERE aid = :aid AND balance - :amount >= 0 RETURNING balance \gset
INSERT INTO ledger (aid, kind, amount, balance_after, ref, created_at) VALUES (:aid, 'withdrawal', :neg, :balance, :ref, :ref);
COMMIT;
`

// pgbenchCeiling runs pgbench with that script against a database of its
// own.
type pgbenchCeiling struct {
	bin, conn, script, dir string
	jobs                   int
	version                string
	cells                  int
	proxy                  *pgProxy // nil: pgbench connects directly
	pg                     *pgAdmin // for the write-transaction count
	dbName                 string
	workNotes              []string // its database work per round
}

func setupPgbench(ctx context.Context, cfg config, pg *pgAdmin, dbName, tmp string, accounts int) (*pgbenchCeiling, error) {
	conn := withDatabase(cfg.pgDSN, dbName)
	db, err := sql.Open("pgx", conn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, pgbenchSchema); err != nil {
		return nil, fmt.Errorf("pgbench schema: %w", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO accounts (aid, balance) SELECT g, 1000000000000000 FROM generate_series(1, $1::int) g`, accounts); err != nil {
		return nil, fmt.Errorf("pgbench accounts: %w", err)
	}
	dir := filepath.Join(tmp, "pgbench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	script := filepath.Join(dir, "withdrawal.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o644); err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, cfg.pgbench, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", cfg.pgbench, err)
	}
	return &pgbenchCeiling{bin: cfg.pgbench, conn: conn, script: script, dir: dir, jobs: cfg.pgbenchJobs, version: strings.TrimSpace(string(out)), dbName: dbName, pg: pg}, nil
}

func (p *pgbenchCeiling) describe() string {
	return fmt.Sprintf("ceiling: %s, -n -M prepared -j min(%d, clients) -f <script>, on its own database; per transaction: UPDATE accounts … WHERE aid = :client AND balance - :amount >= 0 RETURNING balance; INSERT INTO ledger …; in BEGIN/COMMIT", p.version, p.jobs)
}

var tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// run runs pgbench with n clients for warmup + duration (+1 s: -T takes
// whole seconds) and measures, from its per-transaction log, the
// transactions that started and ended in the window [first start +
// warmup, + duration].
func (p *pgbenchCeiling) run(ctx context.Context, n int, warmup, duration time.Duration) *cellResult {
	res := &cellResult{window: duration, cpu: unknownCPU()}
	p.cells++
	prefix := filepath.Join(p.dir, fmt.Sprintf("log%d", p.cells))
	secs := int(math.Ceil((warmup + duration).Seconds())) + 1
	cmd := exec.Command(p.bin, "-n", "-M", "prepared", "-c", strconv.Itoa(n), "-j", strconv.Itoa(min(p.jobs, n)),
		"-T", strconv.Itoa(secs), "-f", p.script, "-l", "--log-prefix", prefix, p.conn)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := testproc.Start(cmd); err != nil {
		res.err = err.Error()
		return res
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// CPU over (about) the window: pgbench connects its clients first, a
	// few milliseconds.
	probe := cpuProbe{pg: true, loadPID: cmd.Process.Pid, proxy: p.proxy, xid: p.pg}
	start := time.Now()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if !sleepUntil(ctx, start.Add(warmup)) {
			return
		}
		a := probe.sample()
		if sleepUntil(ctx, start.Add(warmup+duration)) {
			b := probe.sample()
			res.cpu = cpuShare(a, b)
			res.rt, res.rtOK = roundTrips(a, b)
		}
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGINT)
		err = <-done
	}
	<-sampled
	if m := tpsRe.FindSubmatch(stdout.Bytes()); m != nil {
		res.tps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if err != nil {
		res.err = fmt.Sprintf("pgbench: %v: %s", err, truncate(stderr.String(), 500))
	}
	rtFrom := start.Add(warmup).UnixMicro()
	if perr := p.parseLogs(prefix, warmup, duration, rtFrom, rtFrom+duration.Microseconds(), res); perr != nil && res.err == "" {
		res.err = perr.Error()
	}
	return res
}

// parseLogs reads pgbench's per-transaction logs (one file per thread):
// "client_id transaction_no time script_no time_epoch time_us", time being
// the latency in µs ("failed" or "skipped" when not committed) and
// time_epoch.time_us the end. It also counts the transactions that ended
// in [rtFrom, rtTo] (µs since the epoch), the window of the round-trip
// count.
func (p *pgbenchCeiling) parseLogs(prefix string, warmup, duration time.Duration, rtFrom, rtTo int64, res *cellResult) error {
	files, err := filepath.Glob(prefix + ".*")
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no pgbench log %s.*", prefix)
	}
	type tx struct{ start, end int64 } // µs since the epoch
	var txs []tx
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 6 {
				continue
			}
			lat, err := strconv.ParseInt(fs[2], 10, 64)
			if err != nil {
				res.failed++ // "failed" or "skipped"
				continue
			}
			s, err1 := strconv.ParseInt(fs[4], 10, 64)
			us, err2 := strconv.ParseInt(fs[5], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			end := s*1_000_000 + us
			txs = append(txs, tx{end - lat, end})
			if end >= rtFrom && end <= rtTo {
				res.ended++
			}
		}
		fh.Close()
	}
	res.samples = len(txs)
	if len(txs) == 0 {
		return fmt.Errorf("pgbench logged no transaction")
	}
	first := slices.MinFunc(txs, func(a, b tx) int { return cmp.Compare(a.start, b.start) }).start
	w0 := first + warmup.Microseconds()
	w1 := w0 + duration.Microseconds()
	last := slices.MaxFunc(txs, func(a, b tx) int { return cmp.Compare(a.end, b.end) }).end
	if last < w1 {
		return fmt.Errorf("pgbench's log ends %v before the window does", time.Duration(w1-last)*time.Microsecond)
	}
	for _, t := range txs {
		if t.start >= w0 && t.end <= w1 {
			res.ok++
			res.lat = append(res.lat, time.Duration(t.end-t.start)*time.Microsecond)
		}
	}
	slices.Sort(res.lat)
	return nil
}

// noteRound notes the round's database work of pgbench: its database's
// counters (pg_stat_database, read after its runs exited) and its proxy's
// round trips, per transaction in its logs (warm-up included).
func (p *pgbenchCeiling) noteRound(round int, before, after dbStats, rt0, rt1 proxyCounts, txs int64) {
	if !before.ok || !after.ok || txs <= 0 {
		return
	}
	p.workNotes = append(p.workNotes, fmt.Sprintf("round %d: %s per transaction (%d transactions logged in the round, warm-up included)",
		round+1, pgWork(before, after, rt0, rt1, float64(txs)), txs))
}
