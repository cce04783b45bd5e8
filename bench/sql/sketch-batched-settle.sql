-- A sketch, not the service's statements: a paid withdrawal's settlement
-- batched, one statement settling eight withdrawals (the service's
-- settlements of concurrent requests grouped, as SQLite's write gate groups
-- commits). Each client runs the service's debit every transaction and,
-- every eighth, one statement that settles its last eight: moves the rows,
-- takes them out of the backlog and completes their keys' records, in one
-- asynchronous commit. Prices the database's part of batching (pgbench -D n=0).
\set uid :client_id + 1
\set amount random(1, 10000)
\set neg -:amount
\set r random(1, 9000000000000000000)
\set now 1796307715411702
\set n :n + 1
WITH sess AS (SELECT 1 FROM sessions WHERE token_hash = 'sess' || :uid AND user_id = 'pb' || :uid AND expires_at > 1), og_rec AS (
  INSERT INTO onceguard_idempotency (id, fingerprint, state, lease, lease_until, expires_at, token_hash)
  SELECT 'rec' || :uid || '_' || :n, 'withdrawal:100', 1, 'Z60utY0LzW9fmEQIKbELaQ', :now::bigint, :now::bigint, NULL::text FROM sess
  ON CONFLICT (id) DO NOTHING RETURNING 1 AS n
), og_win AS (
  INSERT INTO onceguard_repeat_window AS w (id, owner, expires_at) SELECT 'win' || :uid || '_' || :n, 'rec' || :uid || '_' || :n || '/Z60utY0LzW9fmEQIKbELaQ', :now::bigint FROM og_rec
  ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner,
    expires_at = CASE WHEN w.expires_at <= 5 THEN EXCLUDED.expires_at ELSE w.expires_at END
  WHERE w.expires_at <= 5 OR w.owner = 'x' OR substr(w.owner, 1, 65) = 'y'
  RETURNING 1
), og_check AS (
  SELECT CASE WHEN r.n > 0 AND NOT (EXISTS (SELECT 1 FROM og_rec) AND EXISTS (SELECT 1 FROM og_win)) THEN CAST('onceguard_start_refused:' || r.n AS int) ELSE r.n END AS n FROM (SELECT count(*) AS n FROM og_rec) r
), acct AS (
  UPDATE accounts SET balance = balance - :amount::bigint, version = version + 1, updated_at = :now::bigint, fence = 1
  WHERE user_id = 'pb' || :uid AND balance - :amount::bigint >= 0 AND fence <= 1 AND EXISTS (SELECT 1 FROM sess) AND (EXISTS (SELECT 1 FROM og_rec) AND EXISTS (SELECT 1 FROM og_win))
  RETURNING balance
), wd AS (
  INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) SELECT 'wd' || :uid || '_' || :n, 'pb' || :uid, 'k' || :uid || '_' || :n, :amount::bigint, 'pending', :now::bigint FROM acct
), pend AS (
  INSERT INTO pending_movements (id, kind, created_at) SELECT 'wd' || :uid || '_' || :n, 'withdrawal', :now::bigint FROM acct
), led AS (
  INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) SELECT 'pb' || :uid, 'withdrawal', :neg::bigint, balance, 'wd' || :uid || '_' || :n, :now::bigint FROM acct
)
SELECT (SELECT balance FROM acct), EXISTS (SELECT 1 FROM sess), (SELECT n FROM og_check);
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
