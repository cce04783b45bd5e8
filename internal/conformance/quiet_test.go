package conformance_test

import (
	"io"
	"log"
)

// quiet drops a server's log: the panic case's stack trace.
var quiet = log.New(io.Discard, "", 0)
