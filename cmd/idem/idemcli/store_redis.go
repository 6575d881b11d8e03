package idemcli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/store/idemredis"
)

// redisStoreHelp is the part of the commands' help on a Redis store's URL.
const redisStoreHelp = `A Redis store (lease mode) is one of:
  redis://[USER:PASS@]HOST:PORT/DB       one server (rediss:// for TLS)
  redis-sentinel://[AUTH@]SENTINEL:PORT/DB?master_name=NAME[&addr=SENTINEL2:PORT...]
                                         the master the Sentinels name (go-redis's
                                         failover client); AUTH (USER:PASS) is
                                         the Sentinels' own, the master's are
                                         the parameters username and password
  redis-cluster://[USER:PASS@]HOST:PORT[?addr=HOST2:PORT...]
                                         a Redis Cluster (any of its nodes)
with rediss-sentinel:// and rediss-cluster:// for TLS. Other query parameters
are go-redis's (dial_timeout=3s, read_timeout=..., pool_size=...; a duration
without a unit is in seconds). idem's own: wait_replicas=N makes every lease
write wait until N replicas have it (Redis WAIT; a write fewer acknowledge
within wait_timeout, default 1s, is a store error and nothing is
acknowledged), so that a failover to a replica keeps every write the proxy
or sidecar reported done; set it to each master's replica count
(docs/failover.md). With wait_replicas, read_timeout (go-redis's default 3s)
must be at least wait_timeout + 500ms.`

// The URL schemes of a Redis store, with the kind of client each opens.
var redisSchemes = map[string]redisKind{
	"redis": redisSingle, "rediss": redisSingle,
	"redis-sentinel": redisSentinel, "rediss-sentinel": redisSentinel,
	"redis-cluster": redisCluster, "rediss-cluster": redisCluster,
}

// redisKind is the kind of Redis deployment a store URL names.
type redisKind int

const (
	redisSingle   redisKind = iota // one server: redis.Options
	redisSentinel                  // Sentinel-managed: redis.FailoverOptions
	redisCluster                   // Redis Cluster: redis.ClusterOptions
)

// isRedisURL reports whether rawURL names a Redis store (a scheme of
// redisSchemes).
func isRedisURL(rawURL string) bool {
	scheme, _, _ := strings.Cut(rawURL, ":")
	_, ok := redisSchemes[strings.ToLower(scheme)]
	return ok
}

// redisStoreURL is a parsed Redis store URL: the options of go-redis's
// client of its kind (one of single, failover, cluster is set) and
// idem's own parameters.
type redisStoreURL struct {
	kind     redisKind
	single   *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
	// wait and waitTimeout are idemredis.Config's WaitReplicas and
	// WaitTimeout (wait_replicas, wait_timeout).
	wait        int
	waitTimeout time.Duration
}

// parseRedisStoreURL parses a Redis store URL (redisStoreHelp): idem's
// parameters are taken out of the query, the scheme becomes redis or
// rediss, and the rest is read by go-redis's ParseURL, ParseFailoverURL
// or ParseClusterURL. Every error matches errBadURL and holds no
// password.
func parseRedisStoreURL(rawURL string) (_ *redisStoreURL, err error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: store %q: "+format, append([]any{errBadURL, secret.URL(rawURL)}, args...)...)
	}
	defer func() { err = secret.Error(err, rawURL) }()
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, bad("%v", err)
	}
	scheme := strings.ToLower(u.Scheme)
	kind, ok := redisSchemes[scheme]
	if !ok {
		return nil, bad("want redis://, redis-sentinel:// or redis-cluster:// (rediss for TLS)")
	}
	r := &redisStoreURL{kind: kind}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, bad("query: %v", err)
	}
	if v := q.Get("wait_replicas"); q.Has("wait_replicas") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, bad("wait_replicas=%q: want a number of replicas, 0 or more", v)
		}
		r.wait = n
	}
	if v := q.Get("wait_timeout"); q.Has("wait_timeout") {
		d, err := parseRedisDuration(v)
		if err != nil || d <= 0 {
			return nil, bad("wait_timeout=%q: want a positive duration such as 500ms (a number without a unit is seconds)", v)
		}
		if r.wait == 0 {
			return nil, bad("wait_timeout without wait_replicas")
		}
		r.waitTimeout = d
	}
	q.Del("wait_replicas")
	q.Del("wait_timeout")
	u.RawQuery = q.Encode()
	u.Scheme = "redis"
	if strings.HasPrefix(scheme, "rediss") {
		u.Scheme = "rediss"
	}
	plain := u.String()
	switch kind {
	case redisSingle:
		r.single, err = redis.ParseURL(plain)
	case redisSentinel:
		r.failover, err = redis.ParseFailoverURL(plain)
		if err == nil && r.failover.MasterName == "" {
			return nil, bad("a Sentinel URL needs master_name=NAME, the master the Sentinels monitor")
		}
	case redisCluster:
		r.cluster, err = redis.ParseClusterURL(plain)
	}
	if err != nil {
		return nil, bad("%v", err)
	}
	if rt := r.readTimeout(); r.wait > 0 && rt >= 0 {
		if rt == 0 {
			rt = 3 * time.Second // go-redis's default
		}
		wt := r.waitTimeout
		if wt == 0 {
			wt = idemredis.DefaultWaitTimeout
		}
		if rt < wt+idemredis.WaitReadMargin {
			return nil, bad("read_timeout=%v must be at least wait_timeout (%v) + %v, or the client gives up on WAIT's reply and sends the write again", rt, wt, idemredis.WaitReadMargin)
		}
	}
	return r, nil
}

// readTimeout is the go-redis client's ReadTimeout (read_timeout).
func (r *redisStoreURL) readTimeout() time.Duration {
	switch r.kind {
	case redisSentinel:
		return r.failover.ReadTimeout
	case redisCluster:
		return r.cluster.ReadTimeout
	}
	return r.single.ReadTimeout
}

// parseRedisDuration reads a duration as go-redis reads the durations of
// its URLs: time.ParseDuration, or a number without a unit in seconds.
func parseRedisDuration(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

// client opens the go-redis client of r's kind and returns it with where,
// a description of the servers for messages (no credentials).
func (r *redisStoreURL) client() (redis.UniversalClient, string) {
	switch r.kind {
	case redisSentinel:
		return redis.NewFailoverClient(r.failover), fmt.Sprintf("redis master %q of the Sentinels at %s", r.failover.MasterName, strings.Join(r.failover.SentinelAddrs, ","))
	case redisCluster:
		return redis.NewClusterClient(r.cluster), "redis cluster at " + strings.Join(r.cluster.Addrs, ",")
	}
	return redis.NewClient(r.single), "redis at " + r.single.Addr
}

// redisStore is an opened Redis store and its client.
type redisStore struct {
	client redis.UniversalClient
	store  *idemredis.Store
	// where names the server for messages, without credentials.
	where string
}

// openRedisStore opens the lease-mode store on the Redis deployment at
// rawURL (parseRedisStoreURL) under the key prefix, once it answers a
// ping (within 10 seconds). Its errors never hold the password.
func openRedisStore(ctx context.Context, rawURL, prefix string) (_ *redisStore, err error) {
	defer func() { err = secret.Error(err, rawURL) }()
	r, err := parseRedisStoreURL(rawURL)
	if err != nil {
		return nil, usageError{err}
	}
	client, where := r.client()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := connect.QuietPing(func() error { return client.Ping(pctx).Err() }); err != nil {
		client.Close()
		return nil, fmt.Errorf("cannot reach %s: %w", where, err)
	}
	st, err := idemredis.New(client, &idemredis.Config{Prefix: prefix, WaitReplicas: r.wait, WaitTimeout: r.waitTimeout})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &redisStore{client: client, store: st, where: where}, nil
}
