-- The reconciler's pending lookups read these indexes (MySQL and MariaDB
-- have no partial indexes: status leads, so the pending rows are one range)
-- instead of scanning tables that only grow: its backlog count (COUNT(*)
-- WHERE status = 'pending', after every pass, from the index alone) and
-- Pending (WHERE status = 'pending' ORDER BY created_at, id LIMIT n, in the
-- index's order, no filesort).
--
-- Write cost: each index holds every row, settled ones too, and the
-- settlement UPDATE changes status, so it moves the row's entry (a delete
-- and an insert in the index) besides updating the row.
--
-- No IF NOT EXISTS: MySQL 8 has none for CREATE INDEX. InnoDB builds a new
-- secondary index online (concurrent writes go on while it builds).
CREATE INDEX deposits_pending ON deposits (status, created_at, id);
CREATE INDEX withdrawals_pending ON withdrawals (status, created_at, id)
