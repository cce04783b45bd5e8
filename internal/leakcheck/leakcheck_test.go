package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func parked(stop chan struct{}) { <-stop }

func TestFindsALeftGoroutine(t *testing.T) {
	stop := make(chan struct{})
	go parked(stop)
	err := Find()
	close(stop)
	if err == nil || !strings.Contains(err.Error(), "leakcheck.parked") {
		t.Fatalf("Find with a parked goroutine = %v; want an error naming leakcheck.parked", err)
	}
	if err := Find(); err != nil {
		t.Fatalf("Find after the goroutine ended: %v", err)
	}
}

func TestIgnoreOptions(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	go parked(stop)
	time.Sleep(10 * time.Millisecond) // let it reach parked
	for name, opt := range map[string]Option{
		"top":     IgnoreTopFunction("github.com/onceguard/onceguard/internal/leakcheck.parked"),
		"any":     IgnoreAnyFunction("github.com/onceguard/onceguard/internal/leakcheck.parked"),
		"current": IgnoreCurrent(),
	} {
		if err := Find(opt); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A function that is not on the stack ignores nothing.
	if err := Find(IgnoreTopFunction("github.com/onceguard/onceguard/internal/leakcheck.other")); err == nil {
		t.Error("Find ignoring an unrelated function found nothing")
	}
}

func TestWaitsForEndingGoroutines(t *testing.T) {
	done := make(chan struct{})
	go func() { time.Sleep(50 * time.Millisecond); close(done) }()
	if err := Find(); err != nil {
		t.Fatalf("a goroutine ending within the wait was reported: %v", err)
	}
	<-done
}

func TestParse(t *testing.T) {
	dump := "goroutine 7 [chan receive, 2 minutes]:\n" +
		"main.wait(0xc000012345)\n\t/src/main.go:10 +0x1d\n" +
		"main.(*T).run(...)\n\t/src/main.go:20\n" +
		"created by main.start in goroutine 1\n\t/src/main.go:30 +0x4f\n\n" +
		"goroutine 8 [running]:\nmain.other()\n\t/src/main.go:40 +0x1\n"
	gs := parse(dump)
	if len(gs) != 2 {
		t.Fatalf("parsed %d goroutines; want 2", len(gs))
	}
	g := gs[0]
	if g.id != 7 || g.state != "chan receive, 2 minutes" || g.top() != "main.wait" || !g.has("main.(*T).run") || g.has("main.start") {
		t.Errorf("parsed %+v", g)
	}
	if gs[1].id != 8 || gs[1].top() != "main.other" {
		t.Errorf("parsed %+v", gs[1])
	}
}
