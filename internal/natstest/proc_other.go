//go:build !linux

package natstest

import "os/exec"

// startCmd starts cmd. Outside Linux there is no parent-death signal, so
// children rely on t.Cleanup alone.
func startCmd(cmd *exec.Cmd) error { return cmd.Start() }

// SpawnerFunction is empty where no spawner goroutine runs.
const SpawnerFunction = ""
