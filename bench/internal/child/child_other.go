//go:build !linux

package child

import "os/exec"

// Start starts cmd. Outside Linux there is no parent-death signal: the
// children are killed by the run's deferred cleanup only.
func Start(cmd *exec.Cmd) error { return cmd.Start() }
