// Package scenariotest holds idemhttp's behavioural tests: the acceptance
// scenarios, run on every store (memory, SQLite, PostgreSQL, MariaDB,
// Redis) through both fronts (the middleware and the reverse proxy), and
// the middleware's, proxy's and client's tests built on the same
// harness. It is a module of its own so that the database drivers and
// stores these tests need stay out of idemhttp's go.mod and out of its
// users' module graphs. It uses idemhttp's exported API only; idemhttp's
// own tests cover its unexported parts on in-memory stores.
package scenariotest
