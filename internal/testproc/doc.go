// Package testproc starts the servers that tests run as child processes
// (redis-server, nats-server) so that they die with the test binary.
package testproc
