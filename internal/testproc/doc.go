// Package testproc starts the servers that tests and the benchmarks run
// as child processes (redis-server, nats-server, PostgreSQL's pgbench,
// the service) so that they die with the process that started them.
package testproc
