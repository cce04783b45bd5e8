//go:build !unix

package redistest

import "os"

// stopSignal and contSignal are nil where job control signals do not exist;
// Server.Pause and Server.Resume then skip the test.
var (
	stopSignal os.Signal
	contSignal os.Signal
)
