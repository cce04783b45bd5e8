package main

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// frontendStream is a client's side of a session as pgx and libpq send
// it: an SSLRequest (refused, then the real startup packet), a prepared
// statement's first use (Parse, Describe, Sync), its next use (Bind,
// Execute, Sync), simple queries (one whose text holds 'S' and 'Q' bytes
// and length-like bytes, one longer than a read buffer), a Flush and the
// Terminate: 2 Syncs and 3 Queries.
func frontendStream(t *testing.T) []byte {
	t.Helper()
	msgs := []pgproto3.FrontendMessage{
		&pgproto3.SSLRequest{},
		&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": "postgres", "database": "ogload"}},
		&pgproto3.Parse{Name: "stmtcache_1", Query: "UPDATE accounts SET balance = balance + $1 WHERE aid = $2 RETURNING balance"},
		&pgproto3.Describe{ObjectType: 'S', Name: "stmtcache_1"},
		&pgproto3.Sync{},
		&pgproto3.Bind{PreparedStatement: "stmtcache_1", Parameters: [][]byte{[]byte("-5"), []byte("7")}},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
		&pgproto3.Query{String: "begin"},
		&pgproto3.Query{String: "SELECT 'S\x00\x00\x00\x04Q\x00\x00\x00\x05'"},
		&pgproto3.Flush{},
		&pgproto3.Query{String: "SELECT '" + strings.Repeat("SQ", 40_000) + "'"},
		&pgproto3.Terminate{},
	}
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func checkCounts(t *testing.T, how string, c *feCounter) {
	t.Helper()
	if c.broken || c.syncs != 2 || c.queries != 3 || c.messages != 13 || c.roundTrips() != 5 {
		t.Errorf("%s: syncs %d queries %d messages %d broken %v, want 2, 3, 13, false", how, c.syncs, c.queries, c.messages, c.broken)
	}
}

// The count does not depend on how the stream is cut into reads: frames
// split anywhere, headers split anywhere, many frames in one read.
func TestFECounterSplitFrames(t *testing.T) {
	stream := frontendStream(t)
	var whole feCounter
	whole.feed(stream)
	checkCounts(t, "one read", &whole)
	for _, size := range []int{1, 2, 3, 4, 5, 7, 8, 9, 13, 64, 4096, 32 * 1024} {
		var c feCounter
		for p := stream; len(p) > 0; {
			n := min(size, len(p))
			c.feed(p[:n])
			p = p[n:]
		}
		checkCounts(t, "reads of "+strconv.Itoa(size), &c)
	}
	// Two reads, cut at every offset of the short messages' part.
	for cut := 0; cut < 300; cut++ {
		var c feCounter
		c.feed(stream[:cut])
		c.feed(stream[cut:])
		checkCounts(t, "cut at "+strconv.Itoa(cut), &c)
	}
}

// TLS after an accepted SSLRequest is not the protocol: counting stops
// instead of counting bytes of ciphertext.
func TestFECounterTLSIsBroken(t *testing.T) {
	b, _ := (&pgproto3.SSLRequest{}).Encode(nil)
	b = append(b, 0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 'S', 'Q') // a ClientHello's start
	var c feCounter
	c.feed(b)
	if !c.broken || c.roundTrips() != 0 {
		t.Fatalf("broken %v, round trips %d: want broken, 0", c.broken, c.roundTrips())
	}
}

// The proxy passes every byte both ways unchanged and counts the
// client's Syncs and Queries.
func TestProxyConnPassesAndCounts(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := up.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("N")) // the server's answer to the SSLRequest
		b, _ := io.ReadAll(c)
		got <- b
	}()
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	var syncs, queries, broken atomic.Int64
	go func() {
		c, err := front.Accept()
		if err == nil {
			proxyConn(c, up.Addr().String(), &syncs, &queries, &broken)
		}
	}()
	c, err := net.Dial("tcp", front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	stream := frontendStream(t)
	for p := stream; len(p) > 0; {
		n := min(3, len(p))
		if len(p) > 1000 {
			n = 777
		}
		if _, err := c.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	answer := make([]byte, 1)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, answer); err != nil || answer[0] != 'N' {
		t.Fatalf("server's byte through the proxy: %q %v", answer, err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	select {
	case b := <-got:
		if !bytes.Equal(b, stream) {
			t.Fatalf("upstream got %d bytes, want the %d sent", len(b), len(stream))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("upstream got nothing")
	}
	c.Close()
	if syncs.Load() != 2 || queries.Load() != 3 || broken.Load() != 0 {
		t.Fatalf("syncs %d queries %d broken %d, want 2 3 0", syncs.Load(), queries.Load(), broken.Load())
	}
}

func TestParseProxyCounts(t *testing.T) {
	c := parseProxyCounts("counts 10 5 3 1\n")
	if !c.ok || c.syncs != 10 || c.queries != 5 || c.conns != 3 || c.broken != 1 || c.roundTrips() != 15 {
		t.Fatalf("%+v", c)
	}
	if parseProxyCounts("listening on x").ok || parseProxyCounts("counts 1 2 x 4").ok {
		t.Fatal("a line that is not counts parsed as counts")
	}
}
