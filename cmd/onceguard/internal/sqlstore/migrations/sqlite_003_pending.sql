-- The reconciler's pending lookups read these partial indexes, which hold
-- only the pending rows, instead of scanning tables that only grow: its
-- backlog count (COUNT(*) WHERE status = 'pending', after every pass, from
-- the index alone) and Pending (WHERE status = 'pending' ORDER BY
-- created_at, id LIMIT n, in the index's order, no sort). The queries must
-- spell the predicate as the index does, a literal, not a parameter.
--
-- Write cost: every movement is inserted pending, so each adds one entry
-- here, and its settlement UPDATE removes it.
CREATE INDEX IF NOT EXISTS deposits_pending ON deposits (created_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS withdrawals_pending ON withdrawals (created_at, id) WHERE status = 'pending'
