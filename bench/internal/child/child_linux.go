//go:build linux

package child

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

var (
	spawnOnce sync.Once
	spawnCh   chan spawnRequest
)

type spawnRequest struct {
	cmd *exec.Cmd
	res chan error
}

// Start starts cmd so that the kernel kills it (SIGKILL) when this
// process dies, even if its deferred cleanup never runs (a SIGKILL, a
// panic in a worker goroutine). Linux sends the parent-death signal when
// the thread that forked the child exits, so every child is forked from one
// goroutine locked to its OS thread for the life of the process.
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
