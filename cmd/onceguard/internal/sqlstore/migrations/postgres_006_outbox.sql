-- The outbox (package outbox): one row per event of a state change (a
-- deposit or withdrawal settled, an order paid), inserted in the
-- transaction of that change when --events is on, and published to NATS
-- JetStream afterwards by the relay, which marks it sent on the ack.
-- UNIQUE(id): one event per id, and the event id names its change.
-- The same statements as outbox.Schema (TestOutboxMigrationIsTheLibrarys).
CREATE TABLE IF NOT EXISTS outbox (
  seq        BIGSERIAL PRIMARY KEY,
  id         VARCHAR(200) NOT NULL,
  subject    VARCHAR(255) NOT NULL,
  payload    BYTEA NOT NULL,
  headers    BYTEA,
  created_at BIGINT NOT NULL,
  due_at     BIGINT NOT NULL,
  attempts   INTEGER NOT NULL DEFAULT 0,
  claim      VARCHAR(64),
  sent_at    BIGINT,
  last_error VARCHAR(500),
  CONSTRAINT outbox_id UNIQUE (id)
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (due_at) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_sent ON outbox (sent_at) WHERE sent_at IS NOT NULL
