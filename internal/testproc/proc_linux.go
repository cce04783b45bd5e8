//go:build linux

package testproc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// spawnRequest asks the spawner goroutine to start a command.
type spawnRequest struct {
	cmd *exec.Cmd
	res chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnRequest
)

// Start starts cmd so that the kernel kills it (SIGKILL) when the test
// binary dies, even if t.Cleanup never runs (for example when go test's
// -timeout panics). Linux delivers the parent-death signal when the thread
// that forked the child exits, so all children are forked from one goroutine
// locked to its OS thread for the life of the process.
func Start(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for req := range spawnCh {
				req.res <- req.cmd.Start()
			}
		}()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	res := make(chan error, 1)
	spawnCh <- spawnRequest{cmd: cmd, res: res}
	return <-res
}

// SpawnerFunction is the top function of the goroutine that forks every
// test server (redis-server, nats-server); it lives as long as the test binary, so leak checks ignore
// it: leakcheck.IgnoreTopFunction(testproc.SpawnerFunction).
const SpawnerFunction = "github.com/onceguard/onceguard/internal/testproc.Start.func1.1"
