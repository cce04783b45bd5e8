//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// stopSignal and contSignal implement Server.Pause and Server.Resume.
var (
	stopSignal os.Signal = syscall.SIGSTOP
	contSignal os.Signal = syscall.SIGCONT
)
