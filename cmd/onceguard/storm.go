package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/storm"
)

// stormFlags defines storm's flags (--amount is read as text, checked by
// runStorm).
func stormFlags(env *envVars, stderr io.Writer) (*flag.FlagSet, *storm.Config, *string) {
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &storm.Config{}
	amount := new(string)
	fs.StringVar(&c.Target, "target", env.str("ONCEGUARD_STORM_TARGET", "http://127.0.0.1:8080"), "base URL of a running onceguard service [ONCEGUARD_STORM_TARGET]")
	fs.IntVar(&c.N, "n", env.int("ONCEGUARD_STORM_N", 50), "concurrent requests in each scenario [ONCEGUARD_STORM_N]")
	fs.StringVar(amount, "amount", env.str("ONCEGUARD_STORM_AMOUNT", "10.00"), "amount of the withdrawals of (a); (b) uses it + 0.01 and (c)'s order it + 0.02 [ONCEGUARD_STORM_AMOUNT]")
	fs.DurationVar(&c.Timeout, "timeout", env.dur("ONCEGUARD_STORM_TIMEOUT", 2*time.Minute), "bound on the whole storm [ONCEGUARD_STORM_TIMEOUT]")
	fs.BoolVar(&c.JSON, "json", env.bool("ONCEGUARD_STORM_JSON", false), "print one JSON document instead of the table [ONCEGUARD_STORM_JSON]")
	return fs, c, amount
}

// runStorm parses storm's flags and fires the storm (storm.Run).
func runStorm(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env := &envVars{getenv: getenv}
	fs, c, amount := stormFlags(env, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := env.err(fs); err != nil {
		return fmt.Errorf("storm: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("storm: unexpected arguments %q", fs.Args())
	}
	if c.N < 2 || c.N > storm.MaxN {
		return fmt.Errorf("storm: --n %d: want 2..%d", c.N, storm.MaxN)
	}
	var err error
	if c.Amount, err = money.Parse(*amount); err != nil || c.Amount <= 0 || c.Amount > 1_000_000_00 {
		return fmt.Errorf("storm: --amount %q: want an amount like 10.00, at most 1000000.00", *amount)
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("storm: --timeout %v: want a positive duration", c.Timeout)
	}
	c.Target = strings.TrimRight(c.Target, "/")
	if !strings.HasPrefix(c.Target, "http://") && !strings.HasPrefix(c.Target, "https://") {
		return fmt.Errorf("storm: --target %q: want a URL like http://127.0.0.1:8080", c.Target)
	}

	return storm.Run(ctx, *c, stdout, stderr, getenv)
}
