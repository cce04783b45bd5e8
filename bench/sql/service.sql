-- The statements the service sends PostgreSQL for one withdrawal (captured with
-- log_statement = all at 9e09bce), one client per user pb<n> with session sess<n>:
-- the debit, with the session's check, the key's record, the window, the row,
-- the backlog entry and the ledger entry (commit 1), then the settlement with
-- the stored answer (commit 2, which does not wait for its WAL flush:
-- synchronous_commit off for its transaction, as the service's unless
-- --durable-settlements). A session's later requests take its user from
-- memory: only its first reads the session first (the variant
-- service-first-request). Ids are random here; :now is a constant.
-- Submit tokens off (--require-submit-token ""); bench/sql/run makes its
-- variants from this file.
\set uid :client_id + 1
\set amount random(1, 10000)
\set neg -:amount
\set r random(1, 9000000000000000000)
\set now 1796307715411702
WITH sess AS (SELECT 1 FROM sessions WHERE token_hash = 'sess' || :uid AND user_id = 'pb' || :uid AND expires_at > 1), og_rec AS (
  INSERT INTO onceguard_idempotency (id, fingerprint, state, lease, lease_until, expires_at, token_hash)
  SELECT 'rec' || :r, 'withdrawal:100', 1, 'Z60utY0LzW9fmEQIKbELaQ', :now::bigint, :now::bigint, NULL::text FROM sess
  ON CONFLICT (id) DO NOTHING RETURNING 1 AS n
), og_win AS (
  INSERT INTO onceguard_repeat_window AS w (id, owner, expires_at) SELECT 'win' || :r, 'rec' || :r || '/Z60utY0LzW9fmEQIKbELaQ', :now::bigint FROM og_rec
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
  INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at) SELECT 'wd' || :r, 'pb' || :uid, 'k' || :r, :amount::bigint, 'pending', :now::bigint FROM acct
), pend AS (
  INSERT INTO pending_movements (id, kind, created_at) SELECT 'wd' || :r, 'withdrawal', :now::bigint FROM acct
), led AS (
  INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) SELECT 'pb' || :uid, 'withdrawal', :neg::bigint, balance, 'wd' || :r, :now::bigint FROM acct
)
SELECT (SELECT balance FROM acct), EXISTS (SELECT 1 FROM sess), (SELECT n FROM og_check);
WITH mv AS (
  UPDATE withdrawals SET status = 'succeeded' WHERE id = 'wd' || :r AND status = 'pending' RETURNING 1
), unpend AS (DELETE FROM pending_movements WHERE id = 'wd' || :r), og_found AS (
  SELECT CASE WHEN count(*) = 0 THEN CAST('onceguard_no_movement:' || count(*) AS int)::text
    WHEN (SELECT count(*) FROM mv) = 0 AND max(status) <> 'succeeded' THEN CAST('onceguard_settled_as:' || max(status) AS int)::text
    ELSE max(status) END AS status
  FROM withdrawals WHERE id = 'wd' || :r
), og_done AS (
  UPDATE onceguard_idempotency SET state = 2, lease = NULL, status = 201, header = '{"Content-Type":["application/json"]}', body = '\x7b22616d6f756e74223a22312e3030222c22637265617465645f6174223a22323032362d31322d30335431343a32313a35355a222c226964223a2277645f366534663263336365386132646533373965636538653863222c22737461747573223a22737563636565646564227d0a'::bytea
  WHERE id = 'rec' || :r AND state = 1 AND lease = 'Z60utY0LzW9fmEQIKbELaQ' RETURNING id
)
SELECT (SELECT count(*) FROM mv), (SELECT status FROM og_found), (SELECT count(*) FROM og_done), set_config('synchronous_commit', 'off', true);
