-- Idempotency keys compare byte for byte, as on PostgreSQL and SQLite.
-- The tables were created under the server's default collation
-- (utf8mb4_general_ci on MariaDB, utf8mb4_0900_ai_ci on MySQL 8), which
-- ignores case: to UNIQUE (user_id, idempotency_key) "CaseKey" and
-- "casekey" were one key, so a deposit, withdrawal or order sent under the
-- second was answered with the first's movement and never made.
--
-- Only the key columns change (utf8mb4_bin: keys are printable ASCII
-- without spaces, so its trailing-space padding never applies). The ids
-- are generated in lowercase and some are foreign keys, which MariaDB does
-- not let a collation change touch.
ALTER TABLE deposits MODIFY idempotency_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE withdrawals MODIFY idempotency_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE orders MODIFY idempotency_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE payments MODIFY idempotency_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
