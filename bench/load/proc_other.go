//go:build !linux

package main

import "os/exec"

// startChild starts cmd. Outside Linux there is no parent-death signal: the
// children are killed by the run's deferred cleanup only.
func startChild(cmd *exec.Cmd) error { return cmd.Start() }
