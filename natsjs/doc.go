// Package natsjs connects onceguard to NATS JetStream, in a module of its
// own (github.com/onceguard/onceguard/natsjs) so that users without NATS
// never download its client. It has both directions of exactly-once
// events: Publisher sends an outbox's events (package outbox), Inbox
// processes each received message once.
//
// # Publishing
//
// Publisher is the outbox's publisher: each message goes to its subject
// with the JetStream header Nats-Msg-Id set to the event's id, and Publish
// returns nil only on the stream's PubAck (a duplicate's included), so a
// relay that republishes after an unknown outcome leaves one message in
// the stream, provided the republish comes inside the stream's duplicates
// window. EnsureStream creates or completes a stream with a window of at
// least DefaultDuplicates (10 minutes).
//
// The caller keeps its own *nats.Conn (or jetstream.JetStream) and its
// options; connect with nats.MaxReconnects(-1) (and
// nats.RetryOnFailedConnect(true) to start while NATS is away) so that an
// outage only delays the relay.
//
// # Consuming
//
// An Inbox consumes a JetStream consumer's messages and processes each
// message id once, in the caller's SQL transaction: the handler's effect
// and the id (sqlstore.Store.OnceTx) commit together, and the message is
// acknowledged only after the commit. JetStream delivers at least once: a
// message is redelivered when its ack is lost, when the consumer dies
// between its commit and its ack, or when a publisher retried it; each of
// those finds its id recorded and is acknowledged without running the
// handler again. A handler that fails rolls back, and its message is
// nak'ed with a backoff and processed again later.
//
// A message's id is its Nats-Msg-Id header (the publisher's id, which the
// stream also deduplicates on within its duplicates window), or, without
// one, its stream and stream sequence; Inbox.ID can read it from the body
// instead.
package natsjs
