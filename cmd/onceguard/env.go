package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// envVars gives flags their defaults from the environment: a variable
// that is set (not empty) overrides the built-in default, and one whose
// value does not parse is an error naming it (env.err), never silently
// the default; unless its flag is given on the command line, which wins
// (flag > environment > built-in default). A flag's variable is the one
// its usage names in brackets at its end ([ONCEGUARD_...]; flagEnv).
type envVars struct {
	getenv func(string) string
	errs   []envError
}

// envError is a variable that did not parse.
type envError struct {
	name string
	err  error
}

func (e *envVars) bad(name, v, want string) {
	e.errs = append(e.errs, envError{name, fmt.Errorf("environment variable %s=%q: want %s", name, v, want)})
}

// err is every variable that did not parse and whose flag was not given
// on fs's command line, or nil. Call it after fs.Parse: a flag given
// replaces its variable's value, so a malformed one does not matter then.
func (e *envVars) err(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if name := flagEnv(f); name != "" {
			given[name] = true
		}
	})
	var errs []error
	for _, b := range e.errs {
		if !given[b.name] {
			errs = append(errs, b.err)
		}
	}
	return errors.Join(errs...)
}

// flagEnv is the environment variable f takes its default from: the one
// its usage names in brackets at its end ("... [ONCEGUARD_LOCK_TTL]"),
// or "" (TestConfigTable checks that every flag names one).
func flagEnv(f *flag.Flag) string {
	u, ok := strings.CutSuffix(f.Usage, "]")
	if !ok {
		return ""
	}
	i := strings.LastIndex(u, "[")
	if i < 0 || !strings.HasPrefix(u[i+1:], "ONCEGUARD_") {
		return ""
	}
	return u[i+1:]
}

func (e *envVars) str(name, def string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return def
}

func (e *envVars) dur(name string, def time.Duration) time.Duration {
	return envParse(e, name, def, time.ParseDuration, "a duration with its unit, like "+def.String())
}

func (e *envVars) int(name string, def int) int {
	return envParse(e, name, def, strconv.Atoi, "a whole number")
}

func (e *envVars) float(name string, def float64) float64 {
	return envParse(e, name, def, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }, "a number")
}

func (e *envVars) bool(name string, def bool) bool {
	return envParse(e, name, def, strconv.ParseBool, "true or false")
}

// envParse returns the variable name parsed, def when it is unset, and
// def with an error recorded (want says what it should be) when it does
// not parse.
func envParse[T any](e *envVars, name string, def T, parse func(string) (T, error), want string) T {
	v := e.getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		e.bad(name, v, want)
		return def
	}
	return x
}
