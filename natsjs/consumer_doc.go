// Package natsjs connects onceguard to NATS JetStream, in its own module
// (github.com/onceguard/onceguard/natsjs) so that users without NATS never
// download it.
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
