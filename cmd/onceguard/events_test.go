//go:build unix

package main

// End-to-end proofs of --events (docs/api.md, "Events"): the service
// process SIGKILLed between commit and publish, the NATS server stopped
// and restarted in the middle of a storm, and several instances sharing
// one outbox. Each test runs its own nats-server on a free port (with
// -js -sd in a temporary directory) and counts the stream's messages by
// Nats-Msg-Id and by subject against the state changes the service's
// own GETs show: exactly one message per state change, never zero.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/natstest"
)

// stateChanges returns the events c's user must have: event id ->
// subject, one per deposit or withdrawal settled and per order paid, as
// the service's GETs show them.
func stateChanges(t *testing.T, c *client) map[string]string {
	t.Helper()
	want := map[string]string{}
	for _, kind := range []string{"deposit", "withdrawal"} {
		for _, m := range faultMovements(t, c, kind+"s") {
			if m.Status != "pending" {
				want["evt_"+m.ID+"_"+m.Status] = "onceguard." + kind + "." + m.Status
			}
		}
	}
	for _, o := range faultMovements(t, c, "orders") { // id and status are all it reads
		if o.Status == "paid" {
			want["evt_"+o.ID+"_paid"] = "onceguard.order.paid"
		}
	}
	return want
}

// streamMessage is one message of the stream ONCEGUARD, as stored.
type streamMessage struct {
	seq          uint64
	msgID, subj  string
	eventID, typ string
}

// readStream returns every message of the stream ONCEGUARD on url and its
// per-subject counts as the server keeps them (nil, nil while there is
// no such stream).
func readStream(url string) ([]streamMessage, map[string]uint64, error) {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return nil, nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "ONCEGUARD")
	if err != nil {
		if strings.Contains(err.Error(), "stream not found") {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("onceguard.>"))
	if err != nil {
		return nil, nil, err
	}
	var out []streamMessage
	if info.State.Msgs > 0 {
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				if strings.Contains(err.Error(), "not found") {
					continue
				}
				return nil, nil, err
			}
			var e struct{ ID, Type string }
			_ = json.Unmarshal(m.Data, &e)
			out = append(out, streamMessage{seq: seq, msgID: m.Header.Get(jetstream.MsgIDHeader), subj: m.Subject, eventID: e.ID, typ: e.Type})
		}
	}
	return out, info.State.Subjects, nil
}

// expectEventsOnce waits (up to 90 s: the relay retries with backoff)
// until the stream holds exactly one message per state change of the
// clients' users and nothing else, and fails with what differs if it
// never does.
func expectEventsOnce(t *testing.T, url string, clients ...*client) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var why string
	for {
		want := map[string]string{}
		for _, c := range clients {
			for id, subj := range stateChanges(t, c) {
				want[id] = subj
			}
		}
		msgs, subjects, err := readStream(url)
		why = diffEvents(want, msgs, subjects, err)
		if why == "" {
			perSubject := map[string]int{}
			for _, s := range want {
				perSubject[s]++
			}
			t.Logf("stream ONCEGUARD holds %d messages, one per state change: %v", len(msgs), perSubject)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90 s the stream does not hold one message per state change: %s", why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// diffEvents says how the stream differs from want ("" when it holds
// exactly one message per wanted id, on its subject, and nothing else).
func diffEvents(want map[string]string, msgs []streamMessage, subjects map[string]uint64, err error) string {
	if err != nil {
		return "reading the stream: " + err.Error()
	}
	var problems []string
	byID := map[string]int{}
	for _, m := range msgs {
		byID[m.msgID]++
		switch subj, ok := want[m.msgID]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("message %d (%s) is no state change the service shows", m.seq, m.msgID))
		case m.subj != subj || m.eventID != m.msgID || "onceguard."+m.typ != m.subj:
			problems = append(problems, fmt.Sprintf("message %d: subject %s, Nats-Msg-Id %s, event id %s, type %s; want subject %s and the event's id as its Nats-Msg-Id",
				m.seq, m.subj, m.msgID, m.eventID, m.typ, subj))
		}
	}
	wantSubjects := map[string]uint64{}
	for id, subj := range want {
		wantSubjects[subj]++
		if n := byID[id]; n != 1 {
			problems = append(problems, fmt.Sprintf("%s: %d messages", id, n))
		}
	}
	for subj, n := range wantSubjects {
		if subjects[subj] != n {
			problems = append(problems, fmt.Sprintf("subject %s: %d messages, want %d", subj, subjects[subj], n))
		}
	}
	if len(msgs) != len(want) {
		problems = append(problems, fmt.Sprintf("%d messages for %d state changes", len(msgs), len(want)))
	}
	slices.Sort(problems)
	if len(problems) > 8 {
		problems = append(problems[:8], fmt.Sprintf("... %d more", len(problems)-8))
	}
	return strings.Join(problems, "; ")
}

// eventsArgs are a service's flags in these tests: the default request
// deadlines and lock TTL (a loaded machine's database may be slow, which
// is not what these tests are about), no reconciler (what a kill leaves
// pending stays pending, with no event).
func eventsArgs(dataDir, pspURL, natsURL string, dbArgs []string) []string {
	return append([]string{"--addr", "127.0.0.1:0", "--data-dir", dataDir, "--psp", pspURL, "--events", natsURL,
		"--reconcile-interval", "1h", "--require-submit-token", "", "--repeat-window", "0"}, dbArgs...)
}

// eventsStorm sends n state-changing requests for c's user through bases
// (round robin), from par goroutines: deposits, withdrawals, and orders
// created and paid. after, if set, is called with the number answered
// so far after each answer. It returns the answers ("201", "503 busy",
// ...) and how many requests died (the process went away).
func eventsStorm(c *client, bases []string, n, par int, tag string, after func(answered int)) (statuses map[string]int, died int) {
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	statuses = map[string]int{}
	var answered atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				base := bases[i%len(bases)]
				key := fmt.Sprintf("%s-%d", tag, i)
				// 503 busy (a lock not had in time: a killed instance's
				// lock lasts its TTL) changed nothing: retried under the
				// same key, as a client does.
				send := func(path, key, body string) (answer, error) {
					deadline := time.Now().Add(60 * time.Second)
					for {
						a, err := faultSend(hc, base, c.token, "POST", path, key, body)
						if err != nil || a.status != 503 || a.body["code"] != "busy" || time.Now().After(deadline) {
							return a, err
						}
						time.Sleep(faultRetryAfter(a))
					}
				}
				var a answer
				var err error
				switch i % 3 {
				case 0:
					a, err = send("/api/v1/deposits", key, fmt.Sprintf(`{"amount":"%d.10"}`, i%7+1))
				case 1:
					a, err = send("/api/v1/withdrawals", key, fmt.Sprintf(`{"amount":"%d.20"}`, i%5+1))
				case 2:
					a, err = send("/api/v1/orders", key, fmt.Sprintf(`{"amount":"%d.30","description":"tea %d"}`, i%4+1, i))
					if err == nil && a.status == 201 {
						id, _ := a.body["id"].(string)
						a, err = send("/api/v1/orders/"+id+"/payment", key+"-pay", `{"method":"wallet"}`)
					}
				}
				mu.Lock()
				if err != nil {
					died++
				} else {
					code, _ := a.body["code"].(string)
					statuses[strings.TrimSpace(fmt.Sprint(a.status, " ", code))]++
				}
				mu.Unlock()
				if err == nil && after != nil {
					after(int(answered.Add(1)))
				}
			}
		})
	}
	wg.Wait()
	return statuses, died
}

// The service SIGKILLed twice: in the middle of a storm while its relay
// publishes (some events published, some committed and not yet, some
// perhaps published and not yet marked sent), and again after a run
// while NATS was down, whose events were all committed and none
// published. Restarted with NATS back, the stream holds exactly one
// message per state change: the events the kills left in the outbox are
// published after the restart, the republished ones deduplicated by
// Nats-Msg-Id. A NATS outage failed no request.
func TestEventsSurviveKill(t *testing.T) {
	bin := buildFaultService(t)
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) { testEventsSurviveKill(t, bin, db(t)) })
	}
}

func testEventsSurviveKill(t *testing.T, bin string, dbArgs []string) {
	srv := natstest.Start(t)
	sim := &psp.Sim{}
	front := startFaultPSP(t, sim, 5*time.Second)
	args := eventsArgs(t.TempDir(), front.url, srv.URL(), dbArgs)

	first := startFaultProcess(t, bin, args...)
	alice := signUp(t, first.base, "alice")
	if a := alice.do("POST", "/api/v1/deposits", "seed", `{"amount":"1000.00"}`); a.status != 201 || a.body["status"] != "succeeded" {
		t.Fatalf("seed deposit = %d %s", a.status, a.raw)
	}
	sim.Inject(psp.Decline, psp.Decline, psp.Decline) // some failed deposits and withdrawals too
	killNow := make(chan struct{}, 1)
	stormDone := make(chan struct{})
	var statuses map[string]int
	var died int
	go func() {
		defer close(stormDone)
		statuses, died = eventsStorm(alice, []string{first.base}, 90, 8, "kill", func(n int) {
			if n == 20 {
				killNow <- struct{}{}
			}
		})
	}()
	select {
	case <-killNow:
	case <-stormDone:
	}
	first.kill(t) // while its relay publishes what the storm commits
	<-stormDone
	t.Logf("first run killed mid-storm: answers %v, %d requests died with it", statuses, died)
	if died == 0 {
		t.Errorf("no request died with the process: the kill came after the storm")
	}

	// NATS down: the requests still succeed, their events wait.
	srv.Kill(t)
	second := startFaultProcess(t, bin, args...)
	alice = &client{t: t, base: second.base, token: alice.token}
	statuses, died = eventsStorm(alice, []string{second.base}, 15, 1, "outage", nil)
	if died != 0 || statuses["201"] != 15 {
		t.Errorf("requests while NATS is down: %v, %d died; want 15 answered 201 (an outage never fails a request)", statuses, died)
	}
	r := alice.do("GET", "/readyz", "", "")
	if c, _ := r.body["components"].(map[string]any); r.status != 200 || r.body["status"] != "degraded" || !strings.HasSuffix(fmt.Sprint(c["events"]), "pending (NATS unreachable)") {
		t.Errorf("readyz while NATS is down = %d %s; want 200 degraded, events N pending (NATS unreachable)", r.status, r.raw)
	}
	second.kill(t) // committed, never published

	srv.Restart(t)
	third := startFaultProcess(t, bin, args...)
	alice = &client{t: t, base: third.base, token: alice.token}
	expectEventsOnce(t, srv.URL(), alice)
	if v, ok := metricValue(scrape(t, third.base), "onceguard_events_published_total", nil); !ok || v < 15 {
		t.Errorf("events_published_total after the restart = %v (present %v); want at least the 15 left by the outage", v, ok)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := alice.do("GET", "/readyz", "", "")
		c, _ := r.body["components"].(map[string]any)
		if c["events"] == "ok" && r.body["status"] == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz 30 s after everything was published = %s; want ok, events ok", r.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The NATS server SIGKILLed in the middle of a storm and restarted (same
// port, same store) while it goes on: every request is answered as
// without events, publishes fail and are retried, and in the end the
// stream holds exactly one message per state change, none lost.
func TestEventsNATSRestartMidStorm(t *testing.T) {
	bin := buildFaultService(t)
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			srv := natstest.Start(t)
			front := startFaultPSP(t, &psp.Sim{}, 5*time.Second)
			p := startFaultProcess(t, bin, eventsArgs(t.TempDir(), front.url, srv.URL(), db(t))...)
			alice := signUp(t, p.base, "alice")
			if a := alice.do("POST", "/api/v1/deposits", "seed", `{"amount":"1000.00"}`); a.status != 201 {
				t.Fatalf("seed deposit = %d %s", a.status, a.raw)
			}
			// The storm goes on while this goroutine kills NATS after 30
			// answers and restarts it after 70 (or later: see below).
			marks := make(chan int, 2)
			stormDone := make(chan struct{})
			var statuses map[string]int
			var died int
			go func() {
				defer close(stormDone)
				statuses, died = eventsStorm(alice, []string{p.base}, 120, 8, "natsrestart", func(n int) {
					if n == 30 || n == 70 {
						marks <- n
					}
				})
			}()
			for _, step := range []string{"kill", "restart"} {
				select {
				case <-marks:
				case <-stormDone:
				}
				if step == "kill" {
					srv.Kill(t)
					// NATS stays down until the relay has met the outage (a publish failed
					// and is retried): the storm's events since the kill wait in the outbox,
					// however fast the storm is.
					for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
						if v, ok := metricValue(scrape(t, p.base), "onceguard_events_retried_total", nil); ok && v > 0 {
							break
						}
						if time.Now().After(deadline) {
							t.Fatal("the relay never retried a publish 20 s into the NATS outage")
						}
					}
				} else {
					srv.Restart(t)
				}
			}
			<-stormDone
			t.Logf("answers %v, %d died", statuses, died)
			if died != 0 {
				t.Errorf("%d requests died; want every request answered", died)
			}
			if statuses["201"] != 120 {
				t.Errorf("answers %v; want 120 answered 201: an outage fails no request", statuses)
			}
			expectEventsOnce(t, srv.URL(), alice)
			text := scrape(t, p.base)
			if v, ok := metricValue(text, "onceguard_events_retried_total", nil); !ok || v == 0 {
				t.Errorf("events_retried_total = %v (present %v); want > 0: the outage must have hit the relay", v, ok)
			}
			if v, ok := metricValue(text, "onceguard_events_published_total", nil); !ok || v == 0 {
				t.Errorf("events_published_total = %v (present %v); want > 0", v, ok)
			}
		})
	}
}

// Three service processes on one database share its outbox, each with
// its relay: a storm spread across them leaves exactly one message per
// state change in the stream, whichever relay published it.
func TestEventsSeveralInstances(t *testing.T) {
	bin := buildFaultService(t)
	for name, db := range databases(t) {
		if name == "sqlite" {
			continue // one process per SQLite file: its locks are in process
		}
		t.Run(name, func(t *testing.T) {
			dbArgs := db(t)
			srv := natstest.Start(t)
			sim := &psp.Sim{}
			front := startFaultPSP(t, sim, 5*time.Second)
			var bases []string
			for range 3 {
				bases = append(bases, startFaultProcess(t, bin, eventsArgs(t.TempDir(), front.url, srv.URL(), dbArgs)...).base)
			}
			var clients []*client
			for i, name := range []string{"alice", "bob", "carol"} {
				c := signUp(t, bases[i], name)
				if a := c.do("POST", "/api/v1/deposits", "seed", `{"amount":"1000.00"}`); a.status != 201 {
					t.Fatalf("seed deposit = %d %s", a.status, a.raw)
				}
				clients = append(clients, c)
			}
			sim.Inject(psp.Decline, psp.Decline)
			var wg sync.WaitGroup
			for _, c := range clients {
				wg.Go(func() {
					statuses, died := eventsStorm(c, bases, 60, 6, "three", nil)
					if died != 0 || statuses["201"] != 60 {
						t.Errorf("storm answers %v, %d died; want 60 answered 201", statuses, died)
					}
				})
			}
			wg.Wait()
			expectEventsOnce(t, srv.URL(), clients...)
			total := 0.0
			for _, b := range bases {
				v, _ := metricValue(scrape(t, b), "onceguard_events_published_total", nil)
				total += v
			}
			t.Logf("published by the three relays together: %v", total)
		})
	}
}
