-- The reconciler's pending lookups read these partial indexes, which hold
-- only the pending rows, instead of scanning tables that only grow: its
-- backlog count (COUNT(*) WHERE status = 'pending', after every pass) and
-- Pending (WHERE status = 'pending' ORDER BY created_at, id LIMIT n, an
-- index scan in the index's order that stops at n).
--
-- Write cost: status is in each index's predicate, which PostgreSQL counts
-- as an indexed column, so the settlement UPDATE (pending to succeeded or
-- failed) is never HOT any more: it writes a new entry into every other
-- index of the table (the primary key, UNIQUE (user_id, idempotency_key))
-- and leaves dead ones for VACUUM, where before it could stay on its heap
-- page without touching an index. Every movement is inserted pending, so
-- each also adds one entry here, which VACUUM removes once it is settled.
--
-- CREATE INDEX blocks writes to the table while it builds. Before upgrading
-- a large database, create the same two indexes with CREATE INDEX
-- CONCURRENTLY (these names and definitions): IF NOT EXISTS then skips them.
CREATE INDEX IF NOT EXISTS deposits_pending ON deposits (created_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS withdrawals_pending ON withdrawals (created_at, id) WHERE status = 'pending'
