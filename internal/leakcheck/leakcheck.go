// Package leakcheck fails a test when goroutines outlive it.
//
// It keeps the library's test dependencies inside the standard library: the
// checks and option names follow go.uber.org/goleak.
package leakcheck

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Option adjusts which goroutines a check ignores.
type Option func(*config)

type config struct {
	ignore []func(goroutine) bool
}

// IgnoreTopFunction ignores goroutines whose innermost frame is in function f.
func IgnoreTopFunction(f string) Option {
	return func(c *config) {
		c.ignore = append(c.ignore, func(g goroutine) bool { return g.top() == f })
	}
}

// IgnoreAnyFunction ignores goroutines with function f anywhere on their stack.
func IgnoreAnyFunction(f string) Option {
	return func(c *config) {
		c.ignore = append(c.ignore, func(g goroutine) bool { return g.has(f) })
	}
}

// IgnoreCurrent ignores every goroutine running when it is called.
func IgnoreCurrent() Option {
	ids := make(map[int]bool)
	for _, g := range goroutines() {
		ids[g.id] = true
	}
	return func(c *config) {
		c.ignore = append(c.ignore, func(g goroutine) bool { return ids[g.id] })
	}
}

// Find returns an error listing the goroutines left running besides the
// caller's, the testing package's and the runtime's own, after waiting up to
// about half a second for them to end (sleeps doubling from 1µs, at most
// 100ms each), as goleak does.
func Find(opts ...Option) error {
	c := &config{}
	for _, o := range opts {
		o(c)
	}
	self := current()
	var left []goroutine
	for delay := time.Microsecond; ; delay *= 2 {
		left = left[:0]
		for _, g := range goroutines() {
			if g.id != self && !background(g) && !c.ignored(g) {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if delay > time.Second {
			break
		}
		time.Sleep(min(delay, 100*time.Millisecond))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d goroutines left running:", len(left))
	for _, g := range left {
		b.WriteString("\n\n")
		b.WriteString(g.stack)
	}
	return fmt.Errorf("%s", b.String())
}

// VerifyNone fails t if goroutines are left running; call it deferred at the
// end of a test that does not run in parallel with others.
func VerifyNone(t testing.TB, opts ...Option) {
	t.Helper()
	if err := Find(opts...); err != nil {
		t.Error(err)
	}
}

// VerifyTestMain runs the tests and, if they passed, fails the run when
// goroutines are left running; call it from TestMain.
func VerifyTestMain(m *testing.M, opts ...Option) {
	code := m.Run()
	if code == 0 {
		if err := Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: errors on a successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func (c *config) ignored(g goroutine) bool {
	for _, f := range c.ignore {
		if f(g) {
			return true
		}
	}
	return false
}

// background reports the goroutines the testing package and the runtime start.
func background(g goroutine) bool {
	switch g.top() {
	case "testing.RunTests", "testing.(*T).Run", "testing.(*T).Parallel", "testing.runFuzzing", "testing.runFuzzTests":
		return strings.HasPrefix(g.state, "chan receive")
	case "os/signal.signal_recv", "os/signal.loop":
		return true
	}
	return g.has("runtime.ensureSigM") || (g.has("runtime.goexit") && strings.HasPrefix(g.state, "syscall"))
}

type goroutine struct {
	id    int
	state string
	funcs []string // innermost first, without the "created by" frame
	stack string
}

func (g goroutine) top() string {
	if len(g.funcs) == 0 {
		return ""
	}
	return g.funcs[0]
}

func (g goroutine) has(f string) bool {
	for _, fn := range g.funcs {
		if fn == f {
			return true
		}
	}
	return false
}

func current() int {
	gs := parse(stackDump(false))
	if len(gs) == 0 {
		return -1
	}
	return gs[0].id
}

func goroutines() []goroutine { return parse(stackDump(true)) }

func stackDump(all bool) string {
	for n := 64 << 10; ; n *= 2 {
		buf := make([]byte, n)
		if m := runtime.Stack(buf, all); m < n {
			return string(buf[:m])
		}
	}
}

// parse reads runtime.Stack's format: a "goroutine N [state]:" header, then
// pairs of a function line and a tab-indented position line, then a blank line.
func parse(dump string) []goroutine {
	var out []goroutine
	sc := bufio.NewScanner(strings.NewReader(dump))
	sc.Buffer(make([]byte, 0, 64<<10), len(dump)+1)
	var g *goroutine
	var stack strings.Builder
	flush := func() {
		if g != nil {
			g.stack = strings.TrimRight(stack.String(), "\n")
			out = append(out, *g)
		}
		g = nil
		stack.Reset()
	}
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "goroutine "); ok && strings.HasSuffix(line, ":") {
			flush()
			idText, state, _ := strings.Cut(strings.TrimSuffix(rest, ":"), " ")
			id, err := strconv.Atoi(idText)
			if err != nil {
				continue
			}
			g = &goroutine{id: id, state: strings.Trim(state, "[]")}
			stack.WriteString(line + "\n")
			continue
		}
		if g == nil {
			continue
		}
		stack.WriteString(line + "\n")
		if line == "" || strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "created by ") || strings.HasPrefix(line, "[originating") {
			continue
		}
		if i := strings.LastIndexByte(line, '('); i > 0 {
			g.funcs = append(g.funcs, line[:i])
		} else if line == "...additional frames elided..." {
			continue
		} else {
			g.funcs = append(g.funcs, line)
		}
	}
	flush()
	return out
}
