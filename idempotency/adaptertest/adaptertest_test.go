package adaptertest_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
)

// startNetHTTP is the net/http adapter's Start: Middleware in front of
// the application, on an httptest server.
func startNetHTTP(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	h := idempotency.Middleware(adaptertest.Options(cfg,
		func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }))(app)
	srv := httptest.NewServer(h)
	srv.Config.ErrorLog = quiet // the panic case's stack
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestNetHTTP(t *testing.T) {
	adaptertest.Run(t, startNetHTTP, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
}

func TestNetHTTPRedis(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "adaptertest") // its keys are deleted when the test ends
	adaptertest.Run(t, startNetHTTP, func(*testing.T) idemstore.FullStore {
		return redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	})
}

// quiet drops the server's log: the panic case's stack trace.
var quiet = log.New(io.Discard, "", 0)

// startBroken is the hand-written adapter the suite exists to catch: it
// stores an empty 200 instead of the handler's answer, so every retry
// gets an empty 200 marked as a replay.
func startBroken(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	g := idempotency.NewGuard(idempotency.Options[*http.Request]{Store: cfg.Store,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := idempotency.ReadBody(r, g.MaxBody())
		out := g.Begin(r.Context(), r, &idempotency.Request{Method: r.Method, Path: r.URL.Path, Key: r.Header["Idempotency-Key"], Body: body})
		switch {
		case out.Problem != nil:
			idempotency.WriteProblem(w, out.Problem)
		case out.Replay != nil:
			idempotency.WriteReplay(w, out.Replay, out.Expires)
		default:
			r.Body = out.Call.Body(body)
			app.ServeHTTP(w, r.WithContext(out.Call.Context()))
			g.Finish(r, out.Call, idempotency.Answer{Status: 200, Written: true})
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// startLostBody is another plausible mistake: the adapter reads the body
// for the Guard and gives the handler the request as it is, its body
// consumed and its context without the Call.
func startLostBody(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	g := idempotency.NewGuard(idempotency.Options[*http.Request]{Store: cfg.Store,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := idempotency.ReadBody(r, g.MaxBody())
		out := g.Begin(r.Context(), r, &idempotency.Request{Method: r.Method, Path: r.URL.Path, Key: r.Header["Idempotency-Key"], Body: body})
		switch {
		case out.Problem != nil:
			idempotency.WriteProblem(w, out.Problem)
		case out.Replay != nil:
			idempotency.WriteReplay(w, out.Replay, out.Expires)
		default:
			rec := idempotency.NewRecorder()
			app.ServeHTTP(rec, r)
			if p := g.Finish(r, out.Call, rec.Answer()); p != nil {
				idempotency.WriteProblem(w, p)
				return
			}
			g.WriteFirst(w, rec.Answer(), out.Expires)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The suite is not vacuous: run on the broken adapter (in a child
// process, whose failure is the expected outcome), it fails, and says
// where.
func TestSuiteCatchesBrokenAdapter(t *testing.T) {
	switch os.Getenv("ADAPTERTEST_BROKEN") {
	case "1":
		adaptertest.Run(t, startBroken, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
		return
	case "body":
		adaptertest.Run(t, startLostBody, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesBrokenAdapter$", "-test.v")
	cmd.Env = append(os.Environ(), "ADAPTERTEST_BROKEN=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed a broken adapter:\n%s", out)
	}
	for _, want := range []string{"--- FAIL: TestSuiteCatchesBrokenAdapter/ReplayByteForByte", "--- FAIL: TestSuiteCatchesBrokenAdapter/InFlight409"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the suite's output lacks %q:\n%s", want, out)
		}
	}
	cmd = exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesBrokenAdapter$", "-test.v")
	cmd.Env = append(os.Environ(), "ADAPTERTEST_BROKEN=body")
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--- FAIL: TestSuiteCatchesBrokenAdapter/ReplayByteForByte") ||
		!strings.Contains(string(out), "--- FAIL: TestSuiteCatchesBrokenAdapter/LeaseEndsHandlerContext") {
		t.Errorf("the suite passed an adapter that loses the body and the Call (%v):\n%s", err, out)
	}
}
