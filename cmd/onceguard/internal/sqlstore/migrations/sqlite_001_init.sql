CREATE TABLE users (
  id            VARCHAR(32) PRIMARY KEY,
  username      VARCHAR(32) NOT NULL UNIQUE,
  password_hash VARCHAR(255) NOT NULL,
  created_at    BIGINT NOT NULL
);
CREATE TABLE sessions (
  token_hash CHAR(64) PRIMARY KEY,
  user_id    VARCHAR(32) NOT NULL REFERENCES users (id),
  expires_at BIGINT NOT NULL,
  created_at BIGINT NOT NULL
);
CREATE TABLE accounts (
  user_id    VARCHAR(32) PRIMARY KEY REFERENCES users (id),
  balance    BIGINT NOT NULL CHECK (balance >= 0),
  currency   CHAR(3) NOT NULL,
  version    BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);
CREATE TABLE deposits (
  id              VARCHAR(32) PRIMARY KEY,
  user_id         VARCHAR(32) NOT NULL REFERENCES users (id),
  idempotency_key VARCHAR(255) NOT NULL,
  amount          BIGINT NOT NULL CHECK (amount > 0),
  status          VARCHAR(16) NOT NULL,
  created_at      BIGINT NOT NULL,
  UNIQUE (user_id, idempotency_key)
);
CREATE TABLE withdrawals (
  id              VARCHAR(32) PRIMARY KEY,
  user_id         VARCHAR(32) NOT NULL REFERENCES users (id),
  idempotency_key VARCHAR(255) NOT NULL,
  amount          BIGINT NOT NULL CHECK (amount > 0),
  status          VARCHAR(16) NOT NULL,
  created_at      BIGINT NOT NULL,
  UNIQUE (user_id, idempotency_key)
);
CREATE TABLE orders (
  id              VARCHAR(32) PRIMARY KEY,
  order_no        VARCHAR(32) NOT NULL UNIQUE,
  user_id         VARCHAR(32) NOT NULL REFERENCES users (id),
  idempotency_key VARCHAR(255) NOT NULL,
  amount          BIGINT NOT NULL CHECK (amount > 0),
  description     VARCHAR(800) NOT NULL,
  status          VARCHAR(16) NOT NULL,
  created_at      BIGINT NOT NULL,
  UNIQUE (user_id, idempotency_key)
);
CREATE TABLE payments (
  id              VARCHAR(32) PRIMARY KEY,
  order_id        VARCHAR(32) NOT NULL REFERENCES orders (id),
  user_id         VARCHAR(32) NOT NULL REFERENCES users (id),
  idempotency_key VARCHAR(255) NOT NULL,
  amount          BIGINT NOT NULL CHECK (amount > 0),
  status          VARCHAR(16) NOT NULL,
  paid_order_id   VARCHAR(32) UNIQUE,
  created_at      BIGINT NOT NULL,
  UNIQUE (user_id, order_id, idempotency_key)
);
CREATE TABLE ledger (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  user_id       VARCHAR(32) NOT NULL REFERENCES users (id),
  kind          VARCHAR(32) NOT NULL,
  amount        BIGINT NOT NULL,
  balance_after BIGINT NOT NULL CHECK (balance_after >= 0),
  ref           VARCHAR(32) NOT NULL,
  created_at    BIGINT NOT NULL,
  UNIQUE (kind, ref)
);
CREATE INDEX ledger_user ON ledger (user_id, id);
