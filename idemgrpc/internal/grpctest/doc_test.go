// Package grpctest holds idemgrpc's tests: the interceptors on every lease
// store (memory, SQLite, PostgreSQL, MariaDB, Redis) over a real gRPC
// connection. It is a module of its own so that the database drivers and
// stores these tests need stay out of idemgrpc's go.mod and out of its
// users' module graphs. idemgrpc keeps its examples, which run on the
// memory store.
package grpctest
