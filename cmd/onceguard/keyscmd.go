package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
)

// keysConfig is `onceguard keys`'s configuration.
type keysConfig struct {
	db, dataDir, method, path, key, user, cookie, id string
	status                                           int
	body, contentType                                string
	force                                            bool
}

func keysFlags(name string, env *envVars, stderr io.Writer) (*flag.FlagSet, *keysConfig) {
	fs := flag.NewFlagSet("keys "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &keysConfig{}
	fs.StringVar(&c.db, "db", env.str("ONCEGUARD_GATEWAY_DB", ""), "the gateway's database URL (default: SQLite under --data-dir) [ONCEGUARD_GATEWAY_DB]")
	fs.StringVar(&c.dataDir, "data-dir", env.str("ONCEGUARD_GATEWAY_DATA_DIR", "./data"), "the gateway's data directory [ONCEGUARD_GATEWAY_DATA_DIR]")
	fs.StringVar(&c.method, "method", "POST", "the request's method")
	fs.StringVar(&c.path, "path", "", "the request's concrete path (/orders/42/pay)")
	fs.StringVar(&c.key, "key", "", "the key (Idempotency-Key or the --key-field value)")
	fs.StringVar(&c.user, "user", "", "the principal header's value (gateway --principal-header)")
	fs.StringVar(&c.cookie, "cookie", "", "the principal cookie's value (gateway --principal-cookie); hashed as the gateway does")
	fs.StringVar(&c.id, "id", "", "the record id instead of --user/--cookie, --method, --path and --key")
	fs.BoolVar(&c.force, "force", false, "fail or answer a key whose outcome is known (a stored upstream answer, or a request in flight)")
	if name == "answer" {
		fs.IntVar(&c.status, "status", 0, "the status the upstream's records show (201)")
		fs.StringVar(&c.body, "body", "", "the answer's body, replayed byte for byte")
		fs.StringVar(&c.contentType, "content-type", "application/json", "the answer's Content-Type")
	}
	return fs, c
}

// runKeys is `onceguard keys inspect|fail|answer`: an operator's look at
// one gateway key, and the settling by hand of a key whose outcome is
// unknown (502 upstream_outcome_unknown, or left in flight by a gateway
// that died) once the upstream's own records say what happened: fail
// frees it (it did not happen: the same key runs again), answer stores
// the answer it got (it happened: retries replay that).
func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "inspect" && args[0] != "fail" && args[0] != "answer") {
		return errors.New("keys: want a subcommand: inspect, fail or answer (see docs/gateway.md)")
	}
	sub := args[0]
	env := &envVars{getenv: getenv}
	fs, c := keysFlags(sub, env, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if err := env.err(fs); err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	id := c.id
	if id == "" {
		if c.path == "" || c.key == "" || (c.user == "") == (c.cookie == "") {
			return errors.New("keys: name the key with --path, --key and one of --user and --cookie (and --method unless POST), or with --id")
		}
		key, err := idempotency.ParseKey([]string{c.key})
		if err != nil {
			return fmt.Errorf("keys: --key: %w", err)
		}
		principal := gateway.HeaderPrincipal(c.user)
		if c.cookie != "" {
			principal = gateway.CookiePrincipal(c.cookie)
		}
		id = idempotency.RecordID(idempotency.Scope{Principal: principal, Method: c.method, Path: c.path}, key)
	}
	if sub == "answer" && (c.status < 200 || c.status > 599) {
		return fmt.Errorf("keys answer: --status %d: want the upstream's status, 200..599", c.status)
	}
	db, dialect, _, err := openDB(serveConfig{db: c.db, dataDir: c.dataDir, dbConns: 2, lockTTL: 10 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := idemsql.New(db, dialect, nil)
	if err != nil {
		return err
	}
	rec, err := store.Inspect(ctx, id)
	if errors.Is(err, idemsql.ErrNoRecord) {
		return fmt.Errorf("keys %s: no record %s: the key was never recorded, was freed, or expired", sub, id)
	}
	if err != nil {
		return err
	}
	if sub == "inspect" {
		return printRecord(stdout, rec, time.Now())
	}
	if !c.force && !unknownOutcome(rec, time.Now()) {
		return fmt.Errorf("keys %s: the record's outcome is known (%s); --force to change it anyway", sub, describeRecord(rec, time.Now()))
	}
	var resp *idemstore.Response
	if sub == "answer" {
		resp = &idemstore.Response{Status: c.status, Header: http.Header{"Content-Type": {c.contentType}}, Body: []byte(c.body)}
	}
	if _, err := store.Resolve(ctx, id, resp); err != nil {
		return err
	}
	after, err := store.Inspect(ctx, id)
	if errors.Is(err, idemsql.ErrNoRecord) {
		fmt.Fprintf(stdout, "freed %s: the key may be sent again\n", id)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "answered %s: retries replay status %d\n", id, after.Response.Status)
	return nil
}

// unknownOutcome reports whether rec is a key whose outcome the gateway
// does not know: its stored answer is 502 upstream_outcome_unknown, or it
// is in flight past its lease (its gateway died).
func unknownOutcome(rec idemstore.Record, now time.Time) bool {
	if rec.State == idemstore.InFlight {
		return now.After(rec.LeaseUntil)
	}
	return rec.Response != nil && rec.Response.Status == http.StatusBadGateway &&
		problemCode(rec.Response.Body) == "upstream_outcome_unknown"
}

func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

func describeRecord(rec idemstore.Record, now time.Time) string {
	switch {
	case rec.State == idemstore.InFlight && now.After(rec.LeaseUntil):
		return "in flight, its lease ran out: outcome unknown"
	case rec.State == idemstore.InFlight:
		return "in flight, its lease ends " + rec.LeaseUntil.UTC().Format(time.RFC3339)
	case unknownOutcome(rec, now):
		return "outcome unknown (502 upstream_outcome_unknown stored)"
	}
	return fmt.Sprintf("answered %d", rec.Response.Status)
}

func printRecord(w io.Writer, rec idemstore.Record, now time.Time) error {
	out := map[string]any{
		"id": rec.ID, "state": map[idemstore.State]string{idemstore.InFlight: "in_flight", idemstore.Completed: "completed"}[rec.State],
		"outcome_unknown": unknownOutcome(rec, now), "summary": describeRecord(rec, now),
		"expires_at": rec.ExpiresAt.UTC().Format(time.RFC3339), "submit_token": rec.TokenHash != "",
	}
	if rec.State == idemstore.InFlight {
		out["lease_until"] = rec.LeaseUntil.UTC().Format(time.RFC3339Nano)
	}
	if r := rec.Response; r != nil {
		out["status"] = r.Status
		out["content_type"] = strings.Join(r.Header.Values("Content-Type"), ", ")
		out["body"] = string(r.Body)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
