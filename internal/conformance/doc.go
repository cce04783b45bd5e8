// Package conformance runs the adapters' conformance suite
// (idempotency/adaptertest) for every adapter of the idempotency Guard on
// every store: memory, Redis, and SQL on PostgreSQL, MySQL/MariaDB and
// SQLite. It is a module of its own so that no adapter module takes the
// SQL drivers or another framework as a dependency; each adapter's own
// module runs the suite on the memory and Redis stores.
package conformance
