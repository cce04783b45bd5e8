-- The service's own secrets, one row each, made once by the first instance
-- that needs one and read by every other: the key that signs submit tokens
-- (so a token minted by one instance is verified by all, with no row per
-- token).
CREATE TABLE IF NOT EXISTS service_secrets (
  name   VARCHAR(64) NOT NULL PRIMARY KEY,
  secret VARCHAR(128) NOT NULL
)
