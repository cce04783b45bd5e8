package storm

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// stormProgress shows how far the storm is: a redrawn bar when its writer
// is a terminal, one plain line per finished phase otherwise (no escape
// sequences into a file or a pipe).
type stormProgress struct {
	w   io.Writer
	tty bool

	mu    sync.Mutex // guards label, total, began and w's writes
	label string
	total int
	began time.Time
	done  atomic.Int64
}

func newStormProgress(w io.Writer, getenv func(string) string) *stormProgress {
	tty := false
	if f, ok := w.(*os.File); ok && getenv("TERM") != "dumb" {
		fi, err := f.Stat()
		tty = err == nil && fi.Mode()&os.ModeCharDevice != 0
	}
	return &stormProgress{w: w, tty: tty}
}

// start begins a phase of total steps; the returned func ends it.
func (p *stormProgress) start(label string, total int) (end func()) {
	p.mu.Lock()
	p.label, p.total, p.began = label, total, time.Now()
	p.done.Store(0)
	p.mu.Unlock()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		if !p.tty {
			<-stop
			return
		}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			p.draw()
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		p.mu.Lock()
		defer p.mu.Unlock()
		took := time.Since(p.began).Round(time.Millisecond)
		if p.tty {
			p.drawLocked()
			fmt.Fprintf(p.w, " %v\n", took)
		} else {
			fmt.Fprintf(p.w, "storm: %s: %d/%d in %v\n", p.label, p.done.Load(), p.total, took)
		}
	}
}

func (p *stormProgress) step() { p.done.Add(1) }

func (p *stormProgress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked()
}

func (p *stormProgress) drawLocked() {
	const width = 30
	done := min(int(p.done.Load()), p.total)
	filled := width
	if p.total > 0 {
		filled = width * done / p.total
	}
	fmt.Fprintf(p.w, "\r\x1b[2K%-36s [%s%s] %d/%d", p.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, p.total)
}
