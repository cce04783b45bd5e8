-- A sketch, not the service's statements: a paid withdrawal's settlement
-- batched, one statement settling eight withdrawals (the service's
-- settlements of concurrent requests grouped, as SQLite's write gate groups
-- commits). bench/sql/run makes the variant sketch-batched-settle from
-- service.sql's debit, run every transaction with ids made of the client and
-- a counter :n (pgbench -D n=...), followed by this statement, which every
-- eighth transaction settles the client's last eight: moves the rows, takes
-- them out of the backlog and completes their keys' records, in one
-- asynchronous commit. It prices the database's part of batching.
\if :n % 8 = 0
WITH v AS (
  SELECT 'wd' || :uid || '_' || g AS id, 'rec' || :uid || '_' || g AS rid FROM generate_series(:n::bigint - 7, :n::bigint) g
), mv AS (
  UPDATE withdrawals w SET status = 'succeeded' FROM v WHERE w.id = v.id AND w.status = 'pending' RETURNING w.id, v.rid
), unpend AS (DELETE FROM pending_movements p USING mv WHERE p.id = mv.id), og_done AS (
  UPDATE onceguard_idempotency i SET state = 2, lease = NULL, status = 201, header = '{"Content-Type":["application/json"]}', body = '\x7b22616d6f756e74223a22312e3030222c22637265617465645f6174223a22323032362d31322d30335431343a32313a35355a222c226964223a2277645f366534663263336365386132646533373965636538653863222c22737461747573223a22737563636565646564227d0a'::bytea
  FROM mv WHERE i.id = mv.rid AND i.state = 1 AND i.lease = 'Z60utY0LzW9fmEQIKbELaQ' RETURNING i.id
)
SELECT (SELECT count(*) FROM mv), (SELECT count(*) FROM og_done), set_config('synchronous_commit', 'off', true);
\endif
