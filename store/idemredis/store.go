package idemredis

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/lastval"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "idem:"

// Config configures a [Store]. The zero value (or a nil *Config) is valid.
type Config struct {
	// Prefix starts every key the Store writes, so that several
	// applications (or test runs) share one Redis database without
	// meeting. It must not contain '{' or '}', which would change the
	// keys' Redis Cluster hash tags. Defaults to "idem:".
	Prefix string
	// WaitReplicas, when positive, makes every lease write (an acquire,
	// a renewal, a completion, a release, a recovery point; one by one or
	// in a batch) wait until that many replicas have it: Redis's WAIT is
	// sent after the write, on the same connection and in the same round
	// trip. A write that fewer replicas acknowledged within WaitTimeout
	// returns an error matching [ErrNotReplicated]; it did happen on the
	// master, so the consumer treats it as any store failure: nothing is
	// acknowledged and the redelivery tries again. An acquire that issued
	// a lease gives it back first (one more script, fenced by the token it
	// issued, without WAIT): a record it created is deleted, a takeover's
	// lease ends and its recovery point is deleted, so the retry runs at
	// once and is not taken for an attempt that may have made its call.
	// When that give-back fails too (the connection lost), the lease is
	// held until it runs out and its point stays (see Redis persistence
	// and replication in the package doc). With one replica per
	// master and WaitReplicas 1, a failover to it keeps every write the
	// Store reported done (docs/failover.md). WAIT counts the replicas of
	// the connection's own server: on a *redis.Client (one master, a
	// Sentinel failover client included) that is the master; through a
	// *redis.ClusterClient the write and its WAIT go to the master of the
	// record's hash slot, on one connection of its own (see Redis Cluster
	// in the package doc), so WaitReplicas counts that master's replicas.
	// Other redis.UniversalClient implementations are refused. Defaults
	// to 0: no WAIT.
	WaitReplicas int
	// WaitTimeout bounds each WAIT, in milliseconds on the server (a
	// duration rounded up to one). Defaults to DefaultWaitTimeout when
	// WaitReplicas is positive. The client's ReadTimeout must exceed it
	// by WaitReadMargin (New refuses it otherwise).
	WaitTimeout time.Duration
}

// WaitReadMargin is how much longer than Config.WaitTimeout the client's
// ReadTimeout must be when Config.WaitReplicas is positive: a WAIT answers
// only after up to WaitTimeout, and a client that stops reading first
// takes the timeout for a lost reply and (go-redis's MaxRetries) sends
// the write and its WAIT again, which turns an acquire whose WAIT fell
// short into a lease nobody holds (see ErrNotReplicated).
const WaitReadMargin = 500 * time.Millisecond

// checkReadTimeout refuses, with ErrInvalidConfig, a client whose
// ReadTimeout is positive and shorter than wait + WaitReadMargin.
func checkReadTimeout(client redis.UniversalClient, wait time.Duration) error {
	var rt time.Duration
	switch c := client.(type) {
	case *redis.Client:
		rt = c.Options().ReadTimeout
	case *redis.ClusterClient:
		rt = c.Options().ReadTimeout
	}
	if rt > 0 && rt < wait+WaitReadMargin {
		return fmt.Errorf("%w: idemredis: the client's ReadTimeout %v must be at least WaitTimeout %v + %v, or WAIT's reply times out and the write is sent again",
			idemdriver.ErrInvalidConfig, rt, wait, WaitReadMargin)
	}
	return nil
}

// DefaultWaitTimeout is Config.WaitTimeout's default.
const DefaultWaitTimeout = time.Second

// Store is an [idemdriver.LeaseStore] (and so an [idemdriver.Retainer]) on
// Redis: lease mode is the only mode Redis has. Every state change is one
// atomic Lua script on the Redis server, timed by the server's clock; see
// the package doc for the keys, the scripts and retention.
//
// A Store is safe for concurrent use. It owns no goroutine and nothing to
// close: the caller owns the client.
type Store struct {
	client redis.UniversalClient
	prefix string
	single bool // client is one server: a script may touch any key
	// cluster is client as a Cluster client, when it is one: with
	// WaitReplicas, a write and its WAIT go to the master of the write's
	// slot (Store.waitClient).
	cluster *redis.ClusterClient
	wait    int // Config.WaitReplicas
	waitMS  int64
	// pipes holds the client's pipelines that batch calls sent
	// (Store.sendBatch), for the next ones: a pipeline keeps nothing of
	// its commands once it has run them.
	pipes sync.Pool

	// The arguments every lease-mode call of a consumer repeats, kept
	// from the last call so that a call does not build them again: the
	// retention index key of the last consumer and the last lease in
	// milliseconds, both boxed.
	doneKeys    lastval.Cache[string, any]
	leaseMillis lastval.Cache[time.Duration, any]
}

// doneKeyArg returns consumerKey(consumer, doneSuffix) as a script
// argument, the last one boxed when it is the same consumer's.
func (s *Store) doneKeyArg(consumer string) any {
	return s.doneKeys.Get(consumer, func(consumer string) any { return s.consumerKey(consumer, doneSuffix) })
}

// leaseArg returns ceilMillis(d) as a script argument, the last one boxed
// when d is the same.
func (s *Store) leaseArg(d time.Duration) any {
	return s.leaseMillis.Get(d, func(d time.Duration) any { return ceilMillis(d) })
}

// recordAndStepsKeys returns the record key of (consumer, id) and the key of its
// recovery points, built as one string.
func (s *Store) recordAndStepsKeys(consumer, id string) (record, steps string) {
	steps = s.recordKeySuffixed(consumer, id, stepsSuffix)
	return steps[:len(steps)-len(stepsSuffix)], steps
}

var _ idemdriver.StepRecorder = (*Store)(nil)

// New returns a Store that keeps its records in the Redis behind client:
// a *redis.Client, a *redis.ClusterClient, a failover client, or anything
// else implementing redis.UniversalClient. cfg may be nil. It returns an
// error matching [idemdriver.ErrInvalidConfig] when client is nil or cfg is
// invalid. New does not contact the server.
func New(client redis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: idemredis: nil client", idemdriver.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return nil, fmt.Errorf("%w: idemredis: Prefix %q contains '{' or '}', which would break the keys' Redis Cluster hash tags", idemdriver.ErrInvalidConfig, c.Prefix)
	}
	_, single := client.(*redis.Client)
	cluster, _ := client.(*redis.ClusterClient)
	if c.WaitReplicas < 0 || c.WaitTimeout < 0 {
		return nil, fmt.Errorf("%w: idemredis: negative WaitReplicas %d or WaitTimeout %v", idemdriver.ErrInvalidConfig, c.WaitReplicas, c.WaitTimeout)
	}
	if c.WaitReplicas > 0 && !single && cluster == nil {
		return nil, fmt.Errorf("%w: idemredis: WaitReplicas needs a *redis.Client or a *redis.ClusterClient, not a %T", idemdriver.ErrInvalidConfig, client)
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.WaitReplicas > 0 {
		if err := checkReadTimeout(client, c.WaitTimeout); err != nil {
			return nil, err
		}
	}
	return &Store{client: client, prefix: c.Prefix, single: single, cluster: cluster, wait: c.WaitReplicas, waitMS: ceilMillis(c.WaitTimeout)}, nil
}

// Key layout; see the package doc.
const (
	// idSeparator separates the consumer name from the message ID inside a
	// record's hash tag. escape escapes it inside either, so the tag
	// splits one way only.
	idSeparator = '\x1f'
	stepsSuffix = ":steps"
	doneSuffix  = ":done"
	runsSuffix  = ":runs"
	purgeSuffix = ":purge"
)

// recordKey returns the key of the hash holding the record of (consumer,
// id): prefix{consumer␟id}. Its recovery points are in recordKey + ":steps",
// in the same hash slot.
func (s *Store) recordKey(consumer, id string) string { return s.recordKeySuffixed(consumer, id, "") }

// recordKeySuffixed is recordKey(consumer, id) + suffix.
func (s *Store) recordKeySuffixed(consumer, id, suffix string) string {
	var arr [128]byte // on the stack for keys of up to 128 bytes
	return string(s.appendRecordKey(arr[:0], consumer, id, suffix))
}

// appendRecordKey appends recordKey(consumer, id) + suffix to b.
func (s *Store) appendRecordKey(b []byte, consumer, id, suffix string) []byte {
	b = append(b, s.prefix...)
	b = append(b, '{')
	b = appendEscaped(b, consumer)
	b = append(b, idSeparator)
	b = appendEscaped(b, id)
	b = append(b, '}')
	return append(b, suffix...)
}

// consumerKey returns prefix{consumer}suffix, a key of the consumer's own
// hash slot: its retention index (doneSuffix), its runs (runsSuffix) and
// its purge lock (purgeSuffix).
func (s *Store) consumerKey(consumer, suffix string) string {
	var arr [128]byte
	b := append(append(arr[:0], s.prefix...), '{')
	b = append(appendEscaped(b, consumer), '}')
	return string(append(b, suffix...))
}

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends s to b with '%', '{', '}', the C0 controls (the
// ID separator among them) and DEL written as %XX. The result never holds
// a brace, so a hash tag built from it is well-formed and is the whole
// escaped text, and since '%' is escaped too, distinct strings never
// escape alike. Other bytes, UTF-8 included, are kept, so keys stay
// readable in redis-cli.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || c == '{' || c == '}' || c < 0x20 || c == 0x7f {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return b
}
