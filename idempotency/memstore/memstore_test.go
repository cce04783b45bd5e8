package memstore_test

import (
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(*testing.T) idempotency.FullStore { return &memstore.Store{} })
}
