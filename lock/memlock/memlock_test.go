package memlock_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	locktest.Run(t, func(*testing.T) lock.Backend { return &memlock.Backend{} })
}
