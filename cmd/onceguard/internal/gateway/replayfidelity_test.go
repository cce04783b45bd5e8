package gateway_test

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
	_ "modernc.org/sqlite"
)

// Replays are byte for byte on memstore and on SQLite: multi-valued and
// non-UTF-8 headers, a streamed (chunked) binary body, a 204.
func TestReplayFidelity(t *testing.T) {
	sqlite := func(t *testing.T) idemstore.FullStore {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "k.db")+"?_pragma=busy_timeout(5000)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := idemsql.New(db, sqldialect.SQLite, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, '\r', '\n', 0x80}
	for sname, newStore := range map[string]func(*testing.T) idemstore.FullStore{
		"memstore": func(*testing.T) idemstore.FullStore { return &memstore.Store{} }, "sqlite": sqlite,
	} {
		for hname, h := range map[string]func(w http.ResponseWriter, r *http.Request){
			"headers+chunked": func(w http.ResponseWriter, r *http.Request) {
				w.Header()["X-Multi"] = []string{"a", "b, c", ""}
				w.Header()["X-Bin"] = []string{"caf\xe9 \xff"}
				w.Header().Add("Link", "</a>; rel=a")
				w.Header().Add("Link", "</b>; rel=b")
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(202)
				for range 3 {
					_, _ = w.Write(bin)
					w.(http.Flusher).Flush()
				}
			},
			"204": func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Id", "7")
				w.WriteHeader(204)
			},
		} {
			t.Run(sname+"/"+hname, func(t *testing.T) {
				u := newUpstream(t)
				u.set(h)
				gw, _ := newGateway(t, u.srv.URL, []string{"POST /pay"}, func(c *gateway.Config) { c.Keys = newStore(t) })
				get := func() (*http.Response, []byte) {
					req, _ := http.NewRequest("POST", gw.URL+"/pay", bytes.NewReader([]byte(`{}`)))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", "k")
					req.AddCookie(&http.Cookie{Name: "PHPSESSID", Value: "s"})
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					var b bytes.Buffer
					_, _ = b.ReadFrom(resp.Body)
					return resp, b.Bytes()
				}
				r1, b1 := get()
				r2, b2 := get()
				strip := func(h http.Header) http.Header {
					h = h.Clone()
					for _, k := range []string{"Date", "Idempotent-Replayed", "Cache-Control", "Set-Cookie", "Content-Length"} {
						delete(h, k)
					}
					return h
				}
				if r2.Header.Get("Idempotent-Replayed") != "true" || r1.StatusCode != r2.StatusCode || !bytes.Equal(b1, b2) || !reflect.DeepEqual(strip(r1.Header), strip(r2.Header)) {
					t.Errorf("first %d %q %v\nreplay %d %q %v", r1.StatusCode, b1, r1.Header, r2.StatusCode, b2, r2.Header)
				}
			})
		}
	}
}
