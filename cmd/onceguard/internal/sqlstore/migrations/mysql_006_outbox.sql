-- The outbox (package outbox): one row per event of a state change (a
-- deposit or withdrawal settled, an order paid), inserted in the
-- transaction of that change when --events is on, and published to NATS
-- JetStream afterwards by the relay, which marks it sent on the ack.
-- UNIQUE(id): one event per id, and the event id names its change.
-- The same statements as outbox.Schema (TestOutboxMigrationIsTheLibrarys).
CREATE TABLE IF NOT EXISTS outbox (
  seq        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  id         VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  subject    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  payload    LONGBLOB NOT NULL,
  headers    BLOB NULL,
  created_at BIGINT NOT NULL,
  due_at     BIGINT NOT NULL,
  attempts   INT NOT NULL DEFAULT 0,
  claim      VARCHAR(64) NULL,
  sent_at    BIGINT NULL,
  last_error VARCHAR(500) NULL,
  UNIQUE KEY outbox_id (id),
  KEY outbox_due (sent_at, due_at),
  KEY outbox_claim (claim)
) ENGINE=InnoDB
