package natstest

import (
	"os/exec"

	"github.com/onceguard/onceguard/internal/testproc"
)

func startCmd(cmd *exec.Cmd) error { return testproc.Start(cmd) }

// SpawnerFunction is the top function of the goroutine that forks every
// test server; leak checks ignore it (see testproc.SpawnerFunction).
const SpawnerFunction = testproc.SpawnerFunction
