package kafkatest

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
	_ "modernc.org/sqlite"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemkafka/internal/testhook"
	"github.com/idem-go/idem/store/idemsql"
)

// waitFor is the bound of every wait in this package's tests: generous, for
// a loaded 2-core machine running -race.
const waitFor = 90 * time.Second

// testPartitions is the number of partitions of every test topic.
const testPartitions = 4

var nameSeq atomic.Int64

// uniqueName returns a topic or group name no other test uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, nameSeq.Add(1))
}

// newCluster starts a kfake cluster of three brokers with the given topics,
// testPartitions partitions each, closed when t ends.
func newCluster(t *testing.T, topics ...string) *kfake.Cluster {
	t.Helper()
	return newClusterAt(t, nil, topics...)
}

// newClusterAt is newCluster answering as the Kafka release whose protocol
// versions v lists (kfake.MaxVersions); nil for the newest kfake knows.
func newClusterAt(t *testing.T, v *kversion.Versions, topics ...string) *kfake.Cluster {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(3), kfake.SeedTopics(testPartitions, topics...)}
	if v != nil {
		opts = append(opts, kfake.MaxVersions(v))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// groupOpts are the options of a test consumer group client, ClientOpts
// included. Short heartbeats make rebalances quick; a short FetchMaxWait
// makes a resumed partition fetch again quickly.
func groupOpts(seeds []string, group, topic string, extra ...kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.HeartbeatInterval(250 * time.Millisecond),
	}
	opts = append(opts, extra...)
	return append(opts, idemkafka.ClientOpts()...)
}

// newClient returns a plain client (producing, admin), closed when t ends.
func newClient(t *testing.T, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// openSQLite opens a fresh SQLite database with idem's tables migrated.
func openSQLite(t *testing.T) (*sql.DB, *idemsql.Store) {
	t.Helper()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "idem.db")))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatalf("idemsql.New: %v", err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return db, store
}

// countRows returns SELECT COUNT(*) of query.
func countRows(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// member is a running Consumer on its own group client.
type member struct {
	t       *testing.T
	cl      *kgo.Client
	c       *idemkafka.Consumer
	runErr  chan error
	joined  chan struct{}
	closeMu sync.Once
}

// startMember builds a group client, a Consumer with cfg, runs it, and
// waits until the client has joined the group (its first assignment).
func startMember(t *testing.T, seeds []string, group, topic string, cfg idemkafka.Config, extra ...kgo.Opt) *member {
	t.Helper()
	m := &member{t: t, runErr: make(chan error, 1), joined: make(chan struct{})}
	var once sync.Once
	extra = append(extra, kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
		once.Do(func() { close(m.joined) })
	}))
	cl, err := kgo.NewClient(groupOpts(seeds, group, topic, extra...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	m.cl = cl
	c, err := idemkafka.NewConsumer(cl, cfg)
	if err != nil {
		cl.Close()
		t.Fatalf("NewConsumer: %v", err)
	}
	m.c = c
	go func() { m.runErr <- c.Run(context.Background()) }()
	t.Cleanup(m.close)
	select {
	case <-m.joined:
	case <-time.After(waitFor):
		t.Fatalf("member did not join group %s within %v", group, waitFor)
	}
	return m
}

// stop stops the Consumer gracefully, then closes the client (leaving the
// group), and checks Run returned nil.
func (m *member) stop(ctx context.Context) error {
	err := m.c.Stop(ctx)
	m.close()
	if rerr := <-m.runErr; rerr != nil {
		m.runErr <- rerr
		return fmt.Errorf("Run returned %w", rerr)
	}
	m.runErr <- nil
	return err
}

// crash kills the member: nothing more is committed or dead-lettered, and
// the client leaves the group without committing.
func (m *member) crash() {
	testhook.Crash(m.c)
	m.close()
}

func (m *member) close() {
	m.closeMu.Do(func() { m.cl.CloseAllowingRebalance() })
}

// deadLetters reads every record of a dead-letter topic from the start up to
// its current end, without a group (nothing is consumed destructively).
func deadLetters(ctx context.Context, seeds []string, topic string) ([]*kgo.Record, error) {
	adm, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	if err := ends.Error(); err != nil {
		return nil, err
	}
	want := map[int32]int64{}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
			total += o.Offset
		}
	})
	if total == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	seen := map[int32]int64{}
	for int64(len(out)) < total {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, err
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < want[r.Partition] && r.Offset >= seen[r.Partition] {
				out = append(out, r)
				seen[r.Partition] = r.Offset + 1
			}
		})
	}
	return out, nil
}

// groupLag returns the number of records of topic the group has not
// committed: the sum over partitions of end offset minus committed offset.
func groupLag(t *testing.T, seeds []string, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	adm := kadm.NewClient(newClient(t, seeds))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	var lag int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := committed.Lookup(topic, o.Partition); ok && c.At > 0 {
			at = c.At
		}
		lag += o.Offset - at
	})
	return lag
}

// header returns the value of the first header named key.
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func joinIDs(ids []string) string { return strings.Join(ids, ",") }
