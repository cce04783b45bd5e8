-- 64 users (one per pgbench client, pb1..pb64), each with an account of a
-- large balance and a live session 'sess<n>', in a database the service
-- has migrated (run it once against the database: migrations run on start).
INSERT INTO users (id, username, password_hash, created_at)
  SELECT 'pb' || g, 'pbuser' || g, 'x', 0 FROM generate_series(1, 64) g ON CONFLICT DO NOTHING;
INSERT INTO accounts (user_id, balance, currency, version, updated_at)
  SELECT 'pb' || g, 4000000000000000000, 'USD', 0, 0 FROM generate_series(1, 64) g ON CONFLICT DO NOTHING;
INSERT INTO sessions (token_hash, user_id, expires_at, created_at)
  SELECT 'sess' || g, 'pb' || g, 9000000000000000000, 0 FROM generate_series(1, 64) g ON CONFLICT DO NOTHING;
CREATE SEQUENCE IF NOT EXISTS ogb_ids;
