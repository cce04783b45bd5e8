package gateway_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Hop-by-hop headers, and those a Connection header names, are dropped
// both ways, on the first answer and on its replay.
func TestHopByHop(t *testing.T) {
	u := newUpstream(t)
	u.set(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 201 Created\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nX-Kept: k\r\nContent-Length: 2\r\n\r\nok")
		_ = brw.Flush()
	})
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /w"})
	send := func() string {
		c, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "POST /w HTTP/1.1\r\nHost: x\r\nCookie: PHPSESSID=s\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nConnection: X-Foo\r\nX-Foo: bar\r\nTe: trailers\r\nContent-Length: 2\r\n\r\n{}")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_ = resp.Header.Write(&b)
		return b.String()
	}
	for i := range 2 {
		h := send()
		if strings.Contains(h, "X-Secret") || strings.Contains(h, "Keep-Alive") || !strings.Contains(h, "X-Kept") {
			t.Errorf("answer %d header:\n%s\nwant X-Kept, no X-Secret, no Keep-Alive", i, h)
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.last.Header.Get("X-Foo") != "" || u.last.Header.Get("Te") != "" {
		t.Errorf("upstream got %v; want no X-Foo, no Te", u.last.Header)
	}
}
