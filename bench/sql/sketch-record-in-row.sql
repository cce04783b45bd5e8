-- A sketch, not the service's statements: a withdrawal whose Idempotency-Key
-- record is its own row (the record's columns on the withdrawal, its
-- uniqueness the row's UNIQUE (user_id, idempotency_key)), to price that
-- redesign against service.sql on the same database (bench/sql/run's variant
-- sketch-record-in-row adds the columns). Commit 1: the session's check, the
-- repeat window, the debit, the withdrawal with its record, the backlog
-- entry, the ledger entry; commit 2 (asynchronous, as the service's): the
-- settlement with the stored answer on the same row, the backlog entry's
-- removal. Left out, as a sketch: the refusals (a key already used, a
-- window held), a submit token's binding, the key's expiry.
\set uid :client_id + 1
\set amount random(1, 10000)
\set neg -:amount
\set r random(1, 9000000000000000000)
\set now 1796307715411702
WITH sess AS (SELECT 1 FROM sessions WHERE token_hash = 'sess' || :uid AND user_id = 'pb' || :uid AND expires_at > 1), og_win AS (
  INSERT INTO onceguard_repeat_window AS w (id, owner, expires_at) SELECT 'win' || :r, 'rec' || :r || '/Z60utY0LzW9fmEQIKbELaQ', :now::bigint FROM sess
  ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner,
    expires_at = CASE WHEN w.expires_at <= 5 THEN EXCLUDED.expires_at ELSE w.expires_at END
  WHERE w.expires_at <= 5 OR w.owner = 'x' OR substr(w.owner, 1, 65) = 'y'
  RETURNING 1
), acct AS (
  UPDATE accounts SET balance = balance - :amount::bigint, version = version + 1, updated_at = :now::bigint, fence = 1
  WHERE user_id = 'pb' || :uid AND balance - :amount::bigint >= 0 AND fence <= 1 AND EXISTS (SELECT 1 FROM sess) AND EXISTS (SELECT 1 FROM og_win)
  RETURNING balance
), wd AS (
  INSERT INTO withdrawals (id, user_id, idempotency_key, amount, status, created_at, fingerprint, rec_state, lease, lease_until)
  SELECT 'wd' || :r, 'pb' || :uid, 'k' || :r, :amount::bigint, 'pending', :now::bigint, 'withdrawal:100', 1, 'Z60utY0LzW9fmEQIKbELaQ', :now::bigint FROM acct
  ON CONFLICT (user_id, idempotency_key) DO NOTHING RETURNING 1
), pend AS (
  INSERT INTO pending_movements (id, kind, created_at) SELECT 'wd' || :r, 'withdrawal', :now::bigint FROM acct
), led AS (
  INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) SELECT 'pb' || :uid, 'withdrawal', :neg::bigint, balance, 'wd' || :r, :now::bigint FROM acct
)
SELECT (SELECT balance FROM acct), EXISTS (SELECT 1 FROM sess), (SELECT count(*) FROM wd);
WITH mv AS (
  UPDATE withdrawals SET status = 'succeeded', rec_state = 2, lease = NULL, answer_status = 201, answer_header = '{"Content-Type":["application/json"]}', answer_body = '\x7b22616d6f756e74223a22312e3030222c22637265617465645f6174223a22323032362d31322d30335431343a32313a35355a222c226964223a2277645f366534663263336365386132646533373965636538653863222c22737461747573223a22737563636565646564227d0a'::bytea
  WHERE id = 'wd' || :r AND status = 'pending' AND lease = 'Z60utY0LzW9fmEQIKbELaQ' RETURNING 1
), unpend AS (DELETE FROM pending_movements WHERE id = 'wd' || :r)
SELECT (SELECT count(*) FROM mv), set_config('synchronous_commit', 'off', true);
