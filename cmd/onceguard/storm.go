package main

import (
	"context"
	"errors"
	"io"
)

// runStorm fires a duplicate storm at a running service (issue 7).
// Placeholder until the command lands.
func runStorm(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return errors.New("storm: not built yet")
}
