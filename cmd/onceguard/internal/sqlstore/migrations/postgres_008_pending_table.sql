-- The reconciler's backlog in a table of its own: a deposit's or a
-- withdrawal's id is inserted with it (pending) and deleted by the statement
-- that settles it. Migration 003's partial indexes named status in their
-- predicate, so every settlement rewrote the row's index entries (an update
-- that is not HOT), which cost the withdrawal path more than a third of its
-- PostgreSQL throughput (bench/README.md, issue 22). Without them the
-- settlement updates the row in place. Pending and PendingCount read this
-- table, which holds only the backlog.
-- Upgrading: an instance of an earlier version does not keep this table.
-- Stop those before an instance of this version starts on the database.
CREATE TABLE IF NOT EXISTS pending_movements (
  id         VARCHAR(32) NOT NULL PRIMARY KEY,
  kind       VARCHAR(16) NOT NULL,
  created_at BIGINT NOT NULL
);
INSERT INTO pending_movements (id, kind, created_at)
  SELECT id, 'deposit', created_at FROM deposits WHERE status = 'pending'
  UNION ALL SELECT id, 'withdrawal', created_at FROM withdrawals WHERE status = 'pending'
  ON CONFLICT (id) DO NOTHING;
DROP INDEX IF EXISTS deposits_pending;
DROP INDEX IF EXISTS withdrawals_pending
