package idemkafka

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// Defaults applied by NewConsumer to zero Config fields.
const (
	// DefaultIDHeader is the record header that carries the message ID.
	DefaultIDHeader = "message-id"
	// DefaultConcurrency is how many partitions a Consumer processes at once.
	DefaultConcurrency = 1
	// DefaultBatchSize is the most records per ProcessBatch call in batch mode.
	DefaultBatchSize = 100
	// DefaultMaxPollRecords is the most records one poll takes from the client.
	DefaultMaxPollRecords = 500
	// DefaultRetryDelay is the wait before a Failed record is processed again.
	DefaultRetryDelay = time.Second
	// DefaultRevokeTimeout is how long a revocation waits for the revoked
	// partitions' records in flight before committing what finished.
	DefaultRevokeTimeout = 10 * time.Second
	// DefaultCommitTimeout bounds one offset commit and one dead-letter produce.
	DefaultCommitTimeout = 10 * time.Second
	// DefaultHandlerTimeout is Config.HandlerTimeout's default.
	DefaultHandlerTimeout = 5 * time.Minute
)

// Headers of a dead-lettered record that locate the original, added after
// the original record's own headers (the message ID header among them, when
// it had one) and the headers every idem adapter writes
// (idem.HeaderDeadLetterReason, idem.HeaderDeadLetterError,
// idem.HeaderDeadLetterStatus, idem.HeaderOriginalMessageID).
const (
	// HeaderOriginalTopic, HeaderOriginalPartition and HeaderOriginalOffset
	// say where the original record was (partition and offset in decimal).
	HeaderOriginalTopic     = "Idem-Original-Topic"
	HeaderOriginalPartition = "Idem-Original-Partition"
	HeaderOriginalOffset    = "Idem-Original-Offset"
)

// Order is the order a Consumer keeps among the records of one partition
// (Config.Order).
type Order int

const (
	// OrderPartition processes the records of one partition one at a
	// time, in offset order: the order Kafka gives. The default.
	OrderPartition Order = iota
	// OrderKey processes records of one partition whose keys differ
	// concurrently; records with byte-equal keys one at a time, in offset
	// order. Records without a key (a nil or empty key) count as one key:
	// they keep offset order among themselves. Offsets are still committed
	// only up to the first record not done.
	OrderKey
)

// String returns "partition" or "key" (the words `idem consume
// --kafka-order` takes), or "Order(N)" for a value out of range.
func (o Order) String() string {
	switch o {
	case OrderPartition:
		return "partition"
	case OrderKey:
		return "key"
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// Config configures a Consumer. Zero values take the documented defaults;
// NewConsumer rejects out-of-range values with an error matching
// idem.ErrInvalidConfig.
type Config struct {
	// Processor runs one record at a time through an Idempotent Consumer
	// (idem.Bind, idem.BindLease or an idem.ProcessorFunc). Exactly one of
	// Processor and BatchProcessor is required.
	Processor idem.Processor
	// BatchProcessor selects batch mode: records of one partition are
	// handed over up to BatchSize at a time, in offset order, in one
	// ProcessBatch call (idem.BindBatch: one transaction per batch).
	BatchProcessor idem.BatchProcessor
	// BatchSize is the most records per ProcessBatch call (batch mode
	// only). Defaults to DefaultBatchSize (100).
	BatchSize int

	// IDHeader is the record header holding the message ID, compared
	// byte for byte. Defaults to DefaultIDHeader ("message-id").
	IDHeader string
	// DeadLetter is the topic that receives records that can never be
	// processed (missing or invalid ID, fingerprint mismatch, poison), with
	// the reason headers. Required: a record is never dropped silently. It
	// must not be a topic the client consumes (NewConsumer checks).
	DeadLetter string

	// Concurrency is how many partitions are processed at once; records of
	// one partition are then processed one after the other, in offset
	// order. Under OrderKey it is instead how many records are processed at
	// once, over all partitions. Defaults to DefaultConcurrency (1).
	Concurrency int
	// Order is the order in which the records of one partition are
	// processed: OrderPartition (the zero value, the default) one at a
	// time in offset order, or OrderKey, where records whose keys differ
	// run concurrently (Concurrency records at once over all partitions)
	// and only records with the same key wait for each other. OrderKey
	// needs Processor (not BatchProcessor). See the package documentation,
	// "Key order".
	Order Order
	// MaxPollRecords is the most records taken from the client per poll.
	// Defaults to DefaultMaxPollRecords (500).
	MaxPollRecords int
	// RetryDelay is the wait before a Failed (retryable) record is processed
	// again, and before an InProgress record whose Outcome gives no
	// RetryAfter. The partition is paused meanwhile; later records wait
	// (under OrderKey only the later records of its key wait, and the
	// partition is not paused for it).
	// Defaults to DefaultRetryDelay (1s).
	RetryDelay time.Duration
	// RevokeTimeout bounds how long a partition revocation (a rebalance,
	// or the client leaving the group) waits for that partition's records
	// in flight before committing the offsets that finished. Keep it well
	// under the group's rebalance timeout (kgo.RebalanceTimeout, 60s by
	// default). Defaults to DefaultRevokeTimeout (10s).
	RevokeTimeout time.Duration
	// CommitTimeout bounds one offset commit and one dead-letter produce.
	// Defaults to DefaultCommitTimeout (10s).
	CommitTimeout time.Duration
	// HandlerTimeout bounds one Processor call (one ProcessBatch call in
	// batch mode): the context it gets ends HandlerTimeout after the call
	// started, so a handler blocked on a stalled connection (a database
	// call with no deadline of its own, behind a black-holed network path)
	// gives up, its transaction rolls back, and the record is retried in
	// place after RetryDelay, its offset not committed, instead of holding
	// its partition for ever. A handler that ignores its context still
	// holds its partition (and, at a revocation, is waited for only
	// RevokeTimeout). Defaults to DefaultHandlerTimeout (5 minutes);
	// negative disables it.
	HandlerTimeout time.Duration
	// RetentionWindow, when set, is the retention window of the processed
	// IDs behind Processor (idem.Config.RetentionWindow). Run then reads
	// retention.ms of the consumed topics once and logs a warning for each
	// topic that keeps records longer: a replay of
	// records older than the window (a group reset to the start, a new
	// group) would process them again. Zero skips the check.
	RetentionWindow time.Duration
	// Logger receives every settlement at the level idem.Settlement.Level
	// gives it (duplicates at debug, dead letters at warn, store failures
	// and panics at error), and commit and fetch problems at warn. Defaults
	// to slog.Default().
	Logger *slog.Logger

	// testOnRevoke, if set, is called when a revocation of these partitions
	// begins, before waiting for their records in flight (for the tests,
	// through testhook.SetOnRevoke).
	testOnRevoke func(partitions map[string][]int32)
}

func (cfg Config) withDefaults() Config {
	if cfg.IDHeader == "" {
		cfg.IDHeader = DefaultIDHeader
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MaxPollRecords == 0 {
		cfg.MaxPollRecords = DefaultMaxPollRecords
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.RevokeTimeout == 0 {
		cfg.RevokeTimeout = DefaultRevokeTimeout
	}
	if cfg.CommitTimeout == 0 {
		cfg.CommitTimeout = DefaultCommitTimeout
	}
	if cfg.HandlerTimeout == 0 {
		cfg.HandlerTimeout = DefaultHandlerTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

func (cfg Config) validate() error {
	switch {
	case cfg.Processor == nil && cfg.BatchProcessor == nil:
		return invalid("one of Processor and BatchProcessor is required")
	case cfg.Processor != nil && cfg.BatchProcessor != nil:
		return invalid("Processor and BatchProcessor are exclusive; set one")
	case cfg.DeadLetter == "":
		return invalid("DeadLetter topic is required (records are never dropped silently)")
	case cfg.Order != OrderPartition && cfg.Order != OrderKey:
		return invalid(fmt.Sprintf("Order %d is neither OrderPartition nor OrderKey", cfg.Order))
	case cfg.Order == OrderKey && cfg.BatchProcessor != nil:
		return invalid("Order OrderKey needs Processor; BatchProcessor hands over consecutive records of a partition")
	case cfg.Concurrency < 0:
		return invalid(fmt.Sprintf("Concurrency %d is negative", cfg.Concurrency))
	case cfg.BatchSize < 0:
		return invalid(fmt.Sprintf("BatchSize %d is negative", cfg.BatchSize))
	case cfg.MaxPollRecords < 0:
		return invalid(fmt.Sprintf("MaxPollRecords %d is negative", cfg.MaxPollRecords))
	case cfg.RetryDelay < 0:
		return invalid(fmt.Sprintf("RetryDelay %v is negative", cfg.RetryDelay))
	case cfg.RevokeTimeout < 0:
		return invalid(fmt.Sprintf("RevokeTimeout %v is negative", cfg.RevokeTimeout))
	case cfg.RetentionWindow < 0:
		return invalid(fmt.Sprintf("RetentionWindow %v is negative", cfg.RetentionWindow))
	case cfg.CommitTimeout < 0:
		return invalid(fmt.Sprintf("CommitTimeout %v is negative", cfg.CommitTimeout))
	}
	return nil
}

func invalid(why string) error {
	return fmt.Errorf("%w: idemkafka: %s", idem.ErrInvalidConfig, why)
}

// ClientOpts returns the kgo options a consumer group client needs to be
// driven by a Consumer; append them last to the client's own options:
//
//	opts := []kgo.Opt{
//		kgo.SeedBrokers("localhost:9092"),
//		kgo.ConsumerGroup("billing"),
//		kgo.ConsumeTopics("invoices"),
//	}
//	cl, err := kgo.NewClient(append(opts, idemkafka.ClientOpts()...)...)
//	c, err := idemkafka.NewConsumer(cl, idemkafka.Config{...})
//
// They are:
//   - kgo.DisableAutoCommit: offsets are committed by the Consumer, and only
//     up to records whose transaction committed (or that were dead-lettered).
//   - kgo.BlockRebalanceOnPoll: a rebalance waits until the records of a poll
//     are handed to the partitions' workers, so a record of a partition this
//     member no longer owns is never taken up, and offsets are never
//     committed for a partition after it was revoked.
//   - kgo.OnPartitionsRevoked: on a revocation (a member joins or leaves,
//     or this client leaves with Close), the Consumer stops taking records
//     of the revoked partitions, waits up to Config.RevokeTimeout for the
//     ones in flight, and commits what finished before the partitions go.
//   - kgo.OnPartitionsLost: on a lost session nothing can be committed any
//     more; the partitions' work is abandoned and left to the next owner.
//   - kgo.WithHooks with a marker, by which NewConsumer checks that the
//     client was built with these options.
//
// The callbacks receive the client and find the Consumer that NewConsumer
// attached to it; before NewConsumer (or after Close) they do nothing. Do
// not set OnPartitionsRevoked or OnPartitionsLost again after them: the last
// one set wins, and the Consumer would not commit on revocation.
func ClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(onRevoked),
		kgo.OnPartitionsLost(onLost),
		kgo.WithHooks(clientMarker{}),
	}
}

// checkClient reports why cl cannot be driven by a Consumer, or nil.
func checkClient(cl *kgo.Client) error {
	if cl == nil {
		return invalid("nil *kgo.Client")
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return invalid("the client has no consumer group (kgo.ConsumerGroup)")
	}
	marked := false
	hooks, _ := cl.OptValue(kgo.WithHooks).([]kgo.Hook)
	for _, h := range hooks {
		if _, ok := h.(clientMarker); ok {
			marked = true
		}
	}
	if !marked {
		return invalid("the client was not built with idemkafka.ClientOpts()")
	}
	if v, _ := cl.OptValue(kgo.DisableAutoCommit).(bool); !v {
		return invalid("the client autocommits; idemkafka.ClientOpts() disables it, do not re-enable")
	}
	if v, _ := cl.OptValue(kgo.BlockRebalanceOnPoll).(bool); !v {
		return invalid("the client lacks kgo.BlockRebalanceOnPoll (part of idemkafka.ClientOpts())")
	}
	return nil
}

// checkDeadLetterTopic refuses a dead-letter topic that cl consumes: by
// name, or matched by a pattern when the client consumes by regular
// expression.
func checkDeadLetterTopic(cl *kgo.Client, dead string) error {
	topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string)
	regex, _ := cl.OptValue(kgo.ConsumeRegex).(bool)
	for _, t := range topics {
		if !regex && t == dead {
			return invalid(fmt.Sprintf("DeadLetter %q is a consumed topic", dead))
		}
		if regex {
			if re, err := regexp.Compile(t); err == nil && re.MatchString(dead) {
				return invalid(fmt.Sprintf("DeadLetter %q matches the consumed topic pattern %q", dead, t))
			}
		}
	}
	return nil
}
