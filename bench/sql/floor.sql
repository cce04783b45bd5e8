-- The floor: pgbench's transaction (debit, ledger entry, one commit) on the service's tables.
\set uid :client_id + 1
\set amount random(1, 10000)
\set neg -:amount
\set r random(1, 9000000000000000000)
BEGIN;
UPDATE accounts SET balance = balance - :amount::bigint, version = version + 1, updated_at = :r::bigint WHERE user_id = 'pb' || :uid AND balance - :amount::bigint >= 0 RETURNING balance \gset
INSERT INTO ledger (user_id, kind, amount, balance_after, ref, created_at) VALUES ('pb' || :uid, 'withdrawal', :neg::bigint, :balance::bigint, 'f' || :r, :r::bigint);
COMMIT;
