-- The outbox (package outbox): one row per event of a state change (a
-- deposit or withdrawal settled, an order paid), inserted in the
-- transaction of that change when --events is on, and published to NATS
-- JetStream afterwards by the relay, which marks it sent on the ack.
-- UNIQUE(id): one event per id, and the event id names its change.
-- The same statements as outbox.Schema (TestOutboxMigrationIsTheLibrarys).
CREATE TABLE IF NOT EXISTS outbox (
  seq        INTEGER PRIMARY KEY AUTOINCREMENT,
  id         TEXT NOT NULL UNIQUE,
  subject    TEXT NOT NULL,
  payload    BLOB NOT NULL,
  headers    BLOB,
  created_at INTEGER NOT NULL,
  due_at     INTEGER NOT NULL,
  attempts   INTEGER NOT NULL DEFAULT 0,
  claim      TEXT,
  sent_at    INTEGER,
  last_error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (due_at) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_sent ON outbox (sent_at) WHERE sent_at IS NOT NULL
