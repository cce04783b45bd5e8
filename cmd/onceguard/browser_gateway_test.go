package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// snippetPage is a form of a non-Go app that uses the gateway's snippet,
// with the key in the form field withdraw_token.
const snippetPage = `<!doctype html><html><head><meta charset="utf-8"><title>withdraw</title>
<script src="/onceguard/v1/snippet.js" defer></script></head><body>
<form id="w" method="post" action="/api/v1/withdraw" data-onceguard="withdrawal" data-onceguard-field="withdraw_token">
<input id="amount" name="amount" value="10"><button id="go" type="submit">Withdraw</button><p id="msg" data-onceguard-message></p>
</form></body></html>`

// The snippet in a real browser, through the gateway in front of an app:
// it fetches a submit token, sends it in withdraw_token, sends one request
// for a burst of clicks, keeps the key and body on a retry after a network
// error, and takes a fresh token after an answer; the same form under that
// token is the window's duplicate.
func TestBrowserGatewaySnippet(t *testing.T) {
	path := needBrowser(t)
	var mu sync.Mutex
	var tokens []string // withdraw_token of every request that reached the app
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && r.URL.Path == "/":
			if _, err := r.Cookie("PHPSESSID"); err != nil {
				http.SetCookie(w, &http.Cookie{Name: "PHPSESSID", Value: "sess-1", Path: "/", HttpOnly: true})
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, snippetPage)
		case r.Method == "POST" && r.URL.Path == "/api/v1/withdraw":
			_ = r.ParseForm()
			mu.Lock()
			tokens = append(tokens, r.PostForm.Get("withdraw_token"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"withdrawal":"done"}`)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer app.Close()
	up, _ := url.Parse(app.URL)
	route, _ := gateway.ParseRoute("POST /api/v1/withdraw withdrawal")
	g, err := gateway.New(gateway.Config{Upstream: up, Routes: []gateway.Route{route}, Keys: &memstore.Store{},
		PrincipalCookie: "PHPSESSID", KeyField: "withdraw_token", RequireToken: map[string]bool{"withdrawal": true}, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g)
	defer gw.Close()

	b := newBrowser(t, path, gw.URL, "net::ERR_CONNECTION_RESET", "429")
	var sentMu sync.Mutex
	var sent []string // the form bodies the page sent
	failed := false
	b.intercept(gw.URL+"/api/v1/withdraw", fetch.RequestStageRequest, func(ev fetch.EventRequestPaused) error {
		sentMu.Lock()
		sent = append(sent, postData(ev))
		first := !failed
		failed = true
		sentMu.Unlock()
		if first { // the network drops the first one before it reaches the gateway
			_, err := chromedp.Call(b.ctx, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: network.ErrorReasonConnectionReset})
			return err
		}
		return b.pass(ev)
	})
	ready := "!" + q("#go") + ".disabled"
	b.waitFor(ready, q("#msg")+".textContent")
	// A burst of six clicks 30 ms apart, in the page (the browser's input
	// pipeline waits on the paused request, so clicks sent over CDP would
	// arrive spread out).
	if !eval[bool](b, `(() => { for (let i = 0; i < 6; i++) setTimeout(() => document.querySelector('#go').click(), i * 30); return true; })()`) {
		t.Fatal("no burst")
	}
	b.waitText("#msg", "The network failed")
	b.waitFor(ready, q("#msg")+".textContent")
	b.clicks("#go", 1, 0, false) // the retry
	b.waitText("#msg", `{"withdrawal":"done"}`)
	sentMu.Lock()
	bodies := append([]string(nil), sent...)
	sentMu.Unlock()
	if len(bodies) != 2 || bodies[0] != bodies[1] {
		t.Fatalf("the page sent %q; want two identical bodies: one for the burst of clicks, the same key and body on the retry", bodies)
	}
	form, err := url.ParseQuery(bodies[0])
	if err != nil || len(form.Get("withdraw_token")) < 10 || form.Get("withdraw_token")[:3] != "st_" || form.Get("amount") != "10" {
		t.Fatalf("body %q; want amount=10 and a submit token in withdraw_token", bodies[0])
	}
	// A fresh token after the answer: the same form again is a duplicate.
	b.waitFor(ready, q("#msg")+".textContent")
	b.clicks("#go", 1, 0, false)
	b.waitText("#msg", "Not sent again")
	sentMu.Lock()
	bodies = append([]string(nil), sent...)
	sentMu.Unlock()
	if len(bodies) != 3 {
		t.Fatalf("the page sent %d requests; want 3", len(bodies))
	}
	if next, _ := url.ParseQuery(bodies[2]); next.Get("withdraw_token") == form.Get("withdraw_token") || next.Get("amount") != "10" {
		t.Errorf("after the answer the page sent %q; want a fresh token", bodies[2])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tokens) != 1 || tokens[0] != form.Get("withdraw_token") {
		t.Errorf("the app got %q; want the one withdrawal, under the first token", tokens)
	}
}
