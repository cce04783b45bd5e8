package memstore_test

import (
	"testing"

	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
	"github.com/onceguard/onceguard/token/tokentest"
)

func TestTokens(t *testing.T) {
	tokentest.Run(t, func(*testing.T) token.Store { return &memstore.Store{} })
}
