package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// ErrNoRecord is returned by Inspect and Resolve for an id with no record.
var ErrNoRecord = errors.New("sqlstore: no such record")

// Inspect returns the record id (idempotency.RecordID of its scope and
// key), as it is stored: for an operator looking at one key. A record
// past its expiry is returned too (it has not been pruned yet).
func (s *Store) Inspect(ctx context.Context, id string) (idemstore.Record, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return idemstore.Record{}, err
	}
	rec, err := s.inspect(ctx, s.db, id)
	return rec, wrap("inspect", err)
}

func (s *Store) inspect(ctx context.Context, q querier, id string) (idemstore.Record, error) {
	var (
		state                 int
		lease, tokenHash      sql.NullString
		leaseUntil, expiresAt int64
		status                sql.NullInt64
		header                sql.NullString
		body                  []byte
	)
	rec := idemstore.Record{ID: id}
	err := q.QueryRowContext(ctx, s.q.inspect, id).Scan(&rec.Fingerprint, &state, &lease, &leaseUntil, &expiresAt, &tokenHash, &status, &header, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, ErrNoRecord
	}
	if err != nil {
		return rec, err
	}
	rec.State, rec.Lease, rec.TokenHash = idemstore.State(state), lease.String, tokenHash.String
	rec.LeaseUntil, rec.ExpiresAt = time.UnixMicro(leaseUntil), time.UnixMicro(expiresAt)
	if rec.State == idemstore.Completed {
		rec.Response = &idemstore.Response{Status: int(status.Int64), Body: body}
		if header.Valid && header.String != "" {
			var err error
			if rec.Response.Header, err = idemstore.UnmarshalHeader(header.String); err != nil {
				return rec, fmt.Errorf("stored header of %s: %w", id, err)
			}
		}
	}
	return rec, nil
}

// Resolve settles the record id by hand, whatever its state, for an
// operator who checked what really happened (a gateway's key whose
// outcome is unknown): with resp nil it deletes the record and frees its
// submit token, so that the key runs again; else it stores resp as the
// key's answer, replayed from then on. A holder still in flight loses
// its lease (its Complete or Abandon returns ErrLeaseLost). The record's
// expiry is kept. It returns the record as it was before.
func (s *Store) Resolve(ctx context.Context, id string, resp *idemstore.Response) (idemstore.Record, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		return idemstore.Record{}, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return idemstore.Record{}, wrap("resolve", err)
	}
	defer func() { _ = tx.Rollback() }()
	before, err := s.inspect(ctx, tx, id)
	if err != nil {
		return before, wrap("resolve", err)
	}
	if resp == nil {
		if _, err := tx.ExecContext(ctx, s.q.deleteRecord, id); err != nil {
			return before, wrap("resolve", err)
		}
		if before.TokenHash != "" {
			if _, err := tx.ExecContext(ctx, s.q.unbindAny, before.TokenHash); err != nil {
				return before, wrap("resolve", err)
			}
		}
	} else {
		args, err := completeArgs(id, "", *resp)
		if err != nil {
			return before, err
		}
		if _, err := tx.ExecContext(ctx, s.q.settle, args[:4]...); err != nil { // status, header, body, id
			return before, wrap("resolve", err)
		}
	}
	if err := s.notify(ctx, tx, id); err != nil { // wake requests waiting on the key (Options.Wait)
		return before, wrap("resolve", err)
	}
	return before, wrap("resolve", tx.Commit())
}
