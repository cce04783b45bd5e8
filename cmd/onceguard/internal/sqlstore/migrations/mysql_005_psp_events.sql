-- Provider callbacks applied, one row per event id: a settlement by callback
-- inserts its event in the settlement's transaction, so that a redelivered
-- event (same id) fails on the UNIQUE constraint and changes nothing,
-- whichever instance it reaches and however many at once. Event ids compare
-- byte for byte (utf8mb4_bin), as on PostgreSQL and SQLite.
CREATE TABLE IF NOT EXISTS psp_events (
  event_id    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  movement_id VARCHAR(32) NOT NULL,
  status      VARCHAR(16) NOT NULL,
  received_at BIGINT NOT NULL,
  CONSTRAINT psp_events_event_id UNIQUE (event_id)
) ENGINE=InnoDB
