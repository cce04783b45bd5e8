//go:build !linux

package testproc

import "os/exec"

// Start starts cmd. Outside Linux there is no parent-death signal, so
// children rely on t.Cleanup alone.
func Start(cmd *exec.Cmd) error { return cmd.Start() }

// SpawnerFunction is empty where no spawner goroutine runs.
const SpawnerFunction = ""
