// Package idemredis is idem's store for Redis on go-redis v9
// (github.com/redis/go-redis/v9): an [idemdriver.LeaseStore], for handlers whose
// side effects are outside any database (an HTTP call, an email). Redis has
// no transaction a handler could share, so lease mode is its only mode:
// idem.LeaseConsumer (package github.com/idem-go/idem) claims a message with a lease and a fencing token,
// renews it while the handler runs, and completes it with the handler's
// result only while the token still owns the record.
//
// It takes the caller's client, a *redis.Client or a *redis.ClusterClient
// (any redis.UniversalClient), and owns nothing else. Hooks added to that
// client (redis.Hook) see the store's commands while they run; a hook that
// keeps a command to read after the call has returned (to log it later,
// say) finds its arguments reused by the next call, since the store hands
// go-redis pooled argument frames: copy what you keep.
//
//	store, err := idemredis.New(client, nil) // keys start with "idem:"
//	if err != nil { ... }
//	payments, err := idem.NewLeaseConsumer(store, idem.Config{Name: "payments"})
//	...
//	out, err := payments.Process(ctx, msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
//		charge, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
//			return provider.Charge(ctx, a.Key("charge"), amount) // the same key on every attempt
//		})
//		...
//	})
//
// Nothing needs creating beforehand: keys appear as messages arrive.
//
// # Keys
//
// Every key starts with [Config.Prefix] ("idem:" by default). A record is
// one hash, its key tagged for Redis Cluster with the consumer name and
// the message ID joined by the byte 0x1F:
//
//	idem:{payments\x1Fpay-1}         hash: the record and its recovery points
//	idem:{payments\x1Fpay-1}:steps   hash: the recovery points of a record written before layout 2
//
// and a consumer has three keys of its own, tagged with its name alone, so
// they share one hash slot:
//
//	idem:{payments}:done    sorted set: the retention index (message ID, scored by finish time)
//	idem:{payments}:runs    sorted set: the consumer's runs ("start:end" in µs, scored by end)
//	idem:{payments}:purge   string: the purge lock, with a TTL
//
// Inside a tag, '%', '{', '}', the C0 control bytes (0x1F among them) and
// DEL are written %XX (uppercase hex). A tag therefore never holds a brace,
// so it is always well-formed and is the whole text between the braces,
// and the escaping is reversible, so distinct (consumer, message ID) pairs
// never share a key: "a{b" is a%7Bb, and the ID "%7B" is %257B. Other
// bytes are kept as they are, so keys stay readable in redis-cli. IDs and
// names are compared byte for byte, as everywhere in idem: "Order-1" and
// "order-1" are two records. The prefix may not contain a brace.
//
// # Records
//
// A record hash has the fields state (1 in_progress, 2 completed, 3 failed:
// [idemdriver.RecordState]), fingerprint, token, attempt, lease_until_ms
// (the lease's end, while in progress), released (present while the
// attempt holding token has released it), result, content_type,
// last_error, created_ms, updated_ms (the last takeover or release; absent
// until then), finished_ms, v (the layout, 2) and
// one field "s:" + name per recovery point, holding its result. A record
// without v was written by a version before layout 2, which kept its
// recovery points in the steps hash beside it (step name -> result); such
// a record is read and updated in that layout for as long as it lives, so
// an upgrade in place needs no migration. A steps hash beside a record
// with v is never read (it can only be left over from an earlier record
// of the same key deleted by hand), and is deleted with the record.
// Processes of a version before layout 2 must not run beside this one (a
// rolling upgrade): such a process taking over a record of layout 2 would
// not see its recovery points, nor this version see the ones it saved
// beside it, so a step saved by one would run again under the other. Stop
// them before starting this version; records they left are read as above.
// Binary values (fingerprint, result, step results) are stored byte for
// byte; Redis strings are binary-safe. No record key has a TTL.
//
// # Scripts
//
// Every state change is one Lua script, run atomically by the server
// (EVALSHA, falling back to EVAL when the server does not have the script
// cached, as go-redis's Script.Run does), and each touches the keys of one
// hash slot only, except Complete on a single Redis server (a
// *redis.Client), which also scores the message in its consumer's
// retention index in the same script, one round trip per completion
// (through a Cluster client the index is scored by a command of its own
// first):
//   - Acquire creates the record (token 1, attempt 1); or takes over an
//     in_progress record whose lease has ended, expired or released, when
//     its fingerprint is the caller's (token + 1, attempt + 1, returning
//     the recovery points); or returns the record's state, attempt count,
//     fingerprint, remaining lease, result, content type and last error.
//     The fingerprint is returned on every path, so the consumer compares
//     it whatever the state: a redelivery with another payload is a
//     mismatch even after completion.
//   - Renew, Complete, Release and SaveStep first check, in the script,
//     that the caller's token owns the record: in progress, same token, not
//     released. An attempt whose lease expired still owns the record until
//     another attempt takes over, so a late finisher's work is kept. When
//     the token does not own it the script changes nothing and answers why;
//     the store returns an error matching [idemdriver.ErrLeaseLost] that says so.
//   - Complete sets the state, result and content type with HSET, field by
//     field: the fingerprint, attempt count and recovery points stay, so a
//     completed record still tells another payload from the same one.
//     Release ends the lease now and
//     keeps the error text; a terminal Release makes the record failed.
//     SaveStep is HSETNX of the step's field: a step saved twice keeps its
//     first result.
//
// # Clock
//
// Every time is the Redis server's, read by the scripts with TIME and kept
// in milliseconds since the Unix epoch: one unit for every record time,
// every lease and every comparison of them. The consumer's runs alone are
// kept in microseconds, TIME's own resolution, with their MaxGap in
// microseconds too (rounded up), so that two marks within one millisecond
// are still distinct runs in order; purge horizons are rounded up to the
// unit of what they are compared with, so "before the horizon" is exact.
// A lease is sent in whole milliseconds, rounded up, so a lease under a
// millisecond is one millisecond, never zero; a lease that is not positive
// is refused with [idemdriver.ErrInvalidConfig]. A lease ending at the
// server's now has run out. The only key with a TTL, the purge lock, is set with PX,
// never EX. The application's clock is never written.
//
// # Validation
//
// Every exported method checks its parameters with the Validate functions
// of package idemdriver before it sends any command (consumer names and
// message IDs, fingerprints, tokens, leases, step names, MaxGap, purge
// horizons and batch limits) and returns their errors, matching
// [idemdriver.ErrInvalidConsumerName], [idemdriver.ErrInvalidMessageID],
// [idemdriver.ErrMissingMessageID], [idemdriver.ErrInvalidPayload],
// [idemdriver.ErrInvalidConfig] or, for a token that is not positive,
// [idemdriver.ErrLeaseLost].
//
// # Redis Cluster
//
// A record's two keys share a hash tag, so its scripts run on one node of
// a cluster, and one consumer's records spread over all of them. The
// consumer's retention index lives in another slot (its own tag), so it is
// written by a command of its own. Complete, and a terminal Release, first
// score the message in the index and then run the record's script; so a
// record that is completed or failed is always in the index, whatever
// fails between the two commands. What such a failure can leave is an
// index entry for a record still in progress (or one a stale owner's
// Complete wrote after a takeover): the purge skips it, and a later
// completion scores it again. An entry whose record is gone is removed by
// the purge.
// Two commands cost Complete and a terminal Release a second network round
// trip; Acquire, Renew, SaveStep and a retryable Release take one.
//
// With [Config.WaitReplicas], every lease write and its WAIT go, in one
// round trip on one connection, to the master that serves the write's
// slot in the Cluster client's slot map (ClusterClient.MasterForKey), so
// that WAIT counts that master's replicas; a batch is then one script and
// WAIT per element. Such a write does not follow a MOVED or ASK reply (a
// slot being moved, or a failover the client has not seen yet): it fails
// like any store error, nothing is acknowledged, the client reads the
// slot map again and the redelivery goes to the new master. The key
// layout is the same with or without a cluster, so data written through
// a *redis.Client reads the same through a Cluster client.
//
// The alternative, tagging every key with the consumer name alone so one
// script could update a record and the index together, would put all of a
// consumer's records on a single node: a busy consumer's whole history
// would be limited to one node's memory. With the tags above only the
// index, a message ID and a score per finished record, stays on one node.
//
// # Retention
//
// The retention policy is idem's (idem.Purge): a settled record is
// deleted once its consumer has been running for the retention window
// since the record was written, so downtime never counts. The store keeps
// what that needs and deletes what it is told to, as an
// [idemdriver.Retainer]:
//   - [Store.MarkRunning] records, by the server's clock, that the
//     consumer runs: one script on its runs key extends the newest run to
//     now if it ended no more than MaxGap ago, or adds a run [now, now].
//   - [Store.BeginPurge] takes the purge lock of the prefix and consumer
//     (SET NX PX with a random holder value and a 30-second TTL), or
//     returns [idemdriver.ErrPurgeInProgress] at once. The session extends
//     the lock at the start of every call and deletes it on Close, by
//     holder only; a cleaner that dies leaves it to expire.
//   - The session's DeleteBatch reads at most its limit of the oldest
//     index entries scored before the horizon, deletes their records
//     (one script per record, pipelined) with their recovery points when
//     they are completed or failed and their finish time is before the
//     horizon, then removes the entries of deleted or vanished records,
//     each only if its score has not changed meanwhile. In_progress
//     records are never deleted; their entries stay and later batches
//     read past them. CountBefore makes the same walk without deleting.
//     PruneRuns deletes the runs that ended before the horizon.
//
// Records get no TTL, not even a generous safety one: Redis expiry follows
// the wall clock, which would break downtime safety, and every finished
// record is reachable by the purge (see Redis Cluster above). An in_progress
// record that is never redelivered stays until it is deleted by hand, as
// on every idem store.
//
// # Operators
//
// For the idem command's operator commands and console (--store
// redis://...), the store is an [idemdriver.Inspector] ([Store.Inspect]
// reads one record; [Store.Stats] is [idemdriver.ErrUnsupported]: there
// is no index of the consumers), an [idemdriver.Operator] (the failed
// records are listed from the retention index; the records in progress,
// which no index holds, are not), an [idemdriver.StepReader] and an
// [idemdriver.Reopener] (one script on the record and its steps).
//
// # Running Redis for idem
//
// A deleted record is a message processed again, so:
//   - Use maxmemory-policy noeviction (the default). An allkeys-* policy
//     evicts records silently; a volatile-* policy never evicts idem's keys,
//     which have no TTL, and then fails writes as noeviction does.
//   - Redis acknowledges a write before it reaches the disk or a replica.
//     A crash (unless appendonly yes with appendfsync always) or a failover
//     to a replica that missed the last writes can lose recent changes: a
//     lost completion makes its message run again (with the same
//     Attempt.Key for its external calls), and a lost takeover can let one
//     fencing token be issued twice, to the attempt that took over before
//     the loss and to one that takes over after it. [Config.WaitReplicas]
//     sends WAIT after each lease write, in the same round trip, and
//     reports a write fewer replicas acknowledged as [ErrNotReplicated]
//     (never an ack). An acquire so reported gives back the lease it
//     issued and that attempt's recovery point, fenced by its token (it
//     never touches a record another attempt took since), so the
//     redelivery or the client's retry runs at once rather than waiting
//     for the lease and then finding the point of an attempt that might
//     have made its call (the HTTP proxy's "outcome unknown" for a
//     request its upstream never saw). If the give-back fails as well (a
//     lost connection, a failover under way), the error says so and the
//     lease stays until it runs out, its point with it: the retry after
//     it is told the outcome is unknown. With one replica and
//     WaitReplicas 1, a failover to it keeps every write the Store
//     reported done (docs/failover.md has
//     the measured matrix, a Redis Cluster with a replica per master
//     included). Without a replica to answer, every write fails after
//     WaitTimeout until one is back (on a cluster: every write on the
//     slots of the master that lacks it).
//   - [Store.FailoverRisk] counts the replicas from INFO replication;
//     idem's consumers log one warning at start when some replica is not
//     waited for.
//
// Redis 6.0 or later is needed; the tests run on Redis 7.0.
//
// # Cost
//
// A message processed by idem.LeaseConsumer.Process takes two round trips
// on a single Redis server, as a hand-written lease does (SET key NX PX,
// then SET key result): the acquire script, and the complete script that
// also indexes the message for retention (through a Cluster client the
// index is one more command). Renewals cost nothing until a handler runs
// for Lease/3: the consumer's one renewal timer schedules them.
// BenchmarkLeaseVsTwoStepSET measures it, with 1 and 8 workers,
// interleaved with two plain SETs and with a hand-written Lua lease with a
// fencing token (two scripts: TIME, HMGET and HSET; HGET and HSET), and
// reports wall time, allocations, client CPU and the server's time and
// CPU per message of each. On the server, a script's cost grows with
// every redis.call and every field it reads or writes: a new message
// costs TIME, EXISTS and one HSET (the record with its run point), then
// HMGET, TIME, the retention index's ZADD and one HSET of four fields,
// about 1.6 times the server instructions of the hand-written lease
// (docs/benchmarks.md has the figures).
//
// # Testing
//
// The tests run against the Redis named by IDEM_TEST_REDIS_URL (e.g.
// redis://127.0.0.1:6379/0), each under a key prefix of its own whose keys
// they delete at the end, and skip without it unless
// IDEM_TEST_REQUIRE_ALL=1. The example needs the variable too. TestCluster
// also starts a three-node Redis Cluster on loopback from the redis-server
// binary and runs the conformance suite on it; TestClusterWaitReplicas
// starts one with a replica per master and runs the suite with
// WaitReplicas 1.
package idemredis
