package memstore_test

import (
	"testing"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
}
