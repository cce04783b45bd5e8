package psp

import (
	"context"
	"errors"
	"fmt"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// Port adapts p to the service's provider port: a deposit is a charge, a withdrawal a payout.
func Port(p Provider) app.Provider { return port{p} }

type port struct{ p Provider }

func (a port) Pay(ctx context.Context, kind app.Kind, key string, amount money.Amount) (app.Status, error) {
	k := Charge
	if kind == app.Withdrawal {
		k = Payout
	}
	return status(a.p.Do(ctx, k, key, amount))
}

func (a port) Lookup(ctx context.Context, key string) (app.Status, error) {
	return status(a.p.Lookup(ctx, key))
}

func status(op Operation, err error) (app.Status, error) {
	switch {
	case errors.Is(err, ErrNotFound):
		return "", fmt.Errorf("%w: %w", app.ErrNoOperation, err)
	case errors.Is(err, ErrUnknownOutcome):
		return "", fmt.Errorf("%w: %w", app.ErrUnknownOutcome, err)
	case err != nil:
		return "", err
	case op.Status == Succeeded:
		return app.Succeeded, nil
	case op.Status == Pending:
		return app.Pending, nil
	}
	return app.Failed, nil
}
