package tokentest_test

import (
	"testing"

	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
	"github.com/onceguard/onceguard/token/tokentest"
)

// A token store proves itself by running the suite from its own tests,
// here the in-process memstore.Store, with a fresh store for each subtest.
// An idemstore.FullStore need not call it: storetest.Run runs it too.
func ExampleRun() {
	// func TestTokens(t *testing.T), in the store's _test.go file:
	testTokens := func(t *testing.T) {
		tokentest.Run(t, func(t *testing.T) token.Store { return &memstore.Store{} })
	}
	_ = testTokens
}
