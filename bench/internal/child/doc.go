// Package child starts the benchmark's child processes (servers, the
// service) so that they die with the benchmark.
package child
