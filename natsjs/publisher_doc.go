// Package natsjs connects onceguard to NATS JetStream, in a module of its
// own so that users without NATS never download its client.
//
// Publisher is the outbox's publisher (package outbox): each message goes
// to its subject with the JetStream header Nats-Msg-Id set to the event's
// id, and Publish returns nil only on the stream's PubAck (a duplicate's
// included), so a relay that republishes after an unknown outcome leaves
// one message in the stream, provided the republish comes inside the
// stream's duplicates window. EnsureStream creates or completes a stream
// with a window of at least DefaultDuplicates (10 minutes).
//
// The caller keeps its own *nats.Conn (or jetstream.JetStream) and its
// options; connect with nats.MaxReconnects(-1) (and
// nats.RetryOnFailedConnect(true) to start while NATS is away) so that an
// outage only delays the relay.
package natsjs
