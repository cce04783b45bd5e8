package main

import (
	"strings"
	"testing"
	"time"
)

// No secret of --db reaches an error or the "database" line of the log.
func TestOpenDBRedactsSecrets(t *testing.T) {
	// --db values openDB refuses: their error must not repeat the password.
	for _, u := range []string{
		"root:s3cr3t@tcp(127.0.0.1:3306)/test",  // go-sql-driver's own DSN, without mysql://
		"postgress://u:s3cr3t@127.0.0.1/db",     // a typo in the scheme
		"host=127.0.0.1 user=u password=s3cr3t", // libpq's key/value form
	} {
		_, _, _, err := openDB(serveConfig{db: u, dataDir: t.TempDir(), lockTTL: time.Second, dbConns: 2})
		if err == nil {
			t.Errorf("openDB(%q) = nil error; want it refused", u)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("openDB refused a --db with its password in the error: %v", err)
		}
	}
	// The database as logged ("database" in "listening"): pgx takes the
	// password as a URL parameter too.
	for _, u := range []string{
		"postgres://u@127.0.0.1:5432/db?password=s3cr3t&sslmode=disable",
		"postgres://u@127.0.0.1:5432/db?sslmode=verify-full&sslpassword=s3cr3t",
	} {
		if got := redactURL(u); strings.Contains(got, "s3cr3t") {
			t.Errorf("redactURL(%q) = %q; want the password hidden", u, got)
		}
	}
}
