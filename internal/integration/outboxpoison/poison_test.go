package outboxpoison_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// One event whose stored headers do not decode (here: MySQL without strict
// mode, the server's or the DSN's sql_mode, silently cuts headers of more
// than 64 KiB to fit its BLOB column) must not keep every other event from
// being published.
func TestPoisonRowDoesNotStarveOthers(t *testing.T) {
	if os.Getenv("ONCEGUARD_TEST_MYSQL") == "" {
		t.Skip("ONCEGUARD_TEST_MYSQL not set")
	}
	dsn := dbtest.FreshMySQL(t, "onceguard_outbox_poison")
	if strings.Contains(dsn, "?") {
		dsn += "&sql_mode=%27%27"
	} else {
		dsn += "?sql_mode=%27%27"
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	o, err := outbox.New(db, sqldialect.MySQL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("h", 70_000)
	if err := o.Write(ctx, tx,
		outbox.Event{ID: "a-big-headers", Subject: "s", Payload: []byte("1"), Headers: map[string][]string{"X": {big}}},
		outbox.Event{ID: "b-plain", Subject: "s", Payload: []byte("2")},
	); err != nil {
		t.Fatalf("Write = %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var published []string
	r, err := outbox.NewRelay(o, outbox.PublisherFunc(func(_ context.Context, m outbox.Message) error {
		published = append(published, m.ID)
		return nil
	}), &outbox.RelayOptions{Batch: 10})
	if err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for range 3 {
		if _, err := r.RunOnce(ctx); err != nil {
			lastErr = err
		}
		// What a relay finds after the lease: the rows are due again.
		if _, err := db.Exec(`UPDATE onceguard_outbox SET due_at = 0 WHERE sent_at IS NULL`); err != nil {
			t.Fatal(err)
		}
	}
	if !contains(published, "b-plain") {
		t.Fatalf("published %v (last error %v); want b-plain published despite a-big-headers", published, lastErr)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
