package idemredis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

const longLease = 10 * time.Minute

func fp(payload string) []byte {
	f, err := idem.SHA256Fingerprint([]byte(payload))
	if err != nil {
		panic(err)
	}
	return f
}

func (b *testBundle) acquire(t *testing.T, consumer, id string, fingerprint []byte, lease time.Duration) idemdriver.AcquireResult {
	t.Helper()
	res, err := b.store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fingerprint, Lease: lease})
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", consumer, id, err)
	}
	return res
}

func (b *testBundle) mustAcquire(t *testing.T, consumer, id string, fingerprint []byte, lease time.Duration, attempt int) idemdriver.AcquireResult {
	t.Helper()
	res := b.acquire(t, consumer, id, fingerprint, lease)
	if !res.Acquired || res.Attempt != attempt || res.Token <= 0 {
		t.Fatalf("Acquire(%q, %q): acquired %v, attempt %d, token %d (state %v); want attempt %d acquired",
			consumer, id, res.Acquired, res.Attempt, res.Token, res.State, attempt)
	}
	return res
}

func (b *testBundle) complete(t *testing.T, consumer, id string, token int64, res []byte, ctype string) {
	t.Helper()
	if err := b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: token, Result: res, ContentType: ctype}); err != nil {
		t.Fatalf("Complete(%q, %q, token %d): %v", consumer, id, token, err)
	}
}

// record returns the raw fields of a record's hash.
func (b *testBundle) record(t *testing.T, consumer, id string) map[string]string {
	t.Helper()
	m, err := b.client.HGetAll(b.ctx, b.store.RecordKey(consumer, id)).Result()
	if err != nil {
		t.Fatalf("HGETALL: %v", err)
	}
	return m
}

func (b *testBundle) serverMillis(t *testing.T) int64 {
	t.Helper()
	now, err := b.client.Time(b.ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMilli()
}

func TestNew(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer client.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	for _, tt := range []struct {
		name   string
		client redis.UniversalClient
		cfg    *idemredis.Config
		ok     bool
	}{
		{"nil config", client, nil, true},
		{"zero config", client, &idemredis.Config{}, true},
		{"prefix", client, &idemredis.Config{Prefix: "app:idem:"}, true},
		{"cluster client", cluster, nil, true},
		{"nil client", nil, nil, false},
		{"prefix with {", client, &idemredis.Config{Prefix: "a{b"}, false},
		{"prefix with }", client, &idemredis.Config{Prefix: "a}b:"}, false},
	} {
		s, err := idemredis.New(tt.client, tt.cfg)
		switch {
		case tt.ok && (err != nil || s == nil):
			t.Errorf("%s: New = %v, %v; want a store", tt.name, s, err)
		case !tt.ok && !errors.Is(err, idem.ErrInvalidConfig):
			t.Errorf("%s: New error = %v, want an error matching ErrInvalidConfig", tt.name, err)
		}
	}
	// The key layout the package doc shows.
	s, _ := idemredis.New(client, nil)
	for got, want := range map[string]string{
		s.RecordKey("payments", "pay-1"):                         "idem:{payments\x1fpay-1}",
		s.RecordKey("payments", "pay-1") + idemredis.StepsSuffix: "idem:{payments\x1fpay-1}:steps",
		s.ConsumerKey("payments", idemredis.DoneSuffix):          "idem:{payments}:done",
		s.ConsumerKey("payments", idemredis.RunsSuffix):          "idem:{payments}:runs",
		s.ConsumerKey("payments", idemredis.PurgeSuffix):         "idem:{payments}:purge",
		s.RecordKey("a{b", "%7B"):                                "idem:{a%7Bb\x1f%257B}",
		s.RecordKey("c}\x1f", "\x00\x7f\u00e9\x1f%"):             "idem:{c%7D%1F\x1f%00%7F\u00e9%1F%25}",
		s.ConsumerKey("{x}", idemredis.DoneSuffix):               "idem:{%7Bx%7D}:done",
	} {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
}

// Of 32 concurrent Acquire calls on a new message exactly one acquires;
// the others see it in progress with a lease within the lease given.
func TestConcurrentAcquire(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const n = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	res := make([]idemdriver.AcquireResult, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			res[i], errs[i] = b.store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: fp("p"), Lease: longLease})
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for i, r := range res {
		switch {
		case errs[i] != nil:
			t.Errorf("Acquire %d: %v", i, errs[i])
		case r.Acquired:
			won++
			if r.Token != 1 || r.Attempt != 1 {
				t.Errorf("winner: token %d, attempt %d; want 1 and 1", r.Token, r.Attempt)
			}
		case r.State != idemdriver.StateInProgress || r.LeaseRemaining <= 0 || r.LeaseRemaining > longLease || !bytes.Equal(r.Fingerprint, fp("p")):
			t.Errorf("loser %d: state %v, remaining %v, fingerprint %x", i, r.State, r.LeaseRemaining, r.Fingerprint)
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d concurrent Acquire calls acquired, want 1", won, n)
	}
}

// A lease that runs out by itself (no test hook) is taken over at the
// first Acquire at or after its end by the server's clock, never before:
// every Acquire before it sees a positive remaining lease. The takeover
// gets token and attempt 2 and attempt 1's recovery points.
func TestTakeoverAfterNaturalExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const lease = 20 * time.Millisecond
	a1 := b.mustAcquire(t, "c", "m", fp("p"), lease, 1)
	if err := b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a1.Token, Step: "charge", Result: []byte("ch_1")}); err != nil {
		t.Fatalf("SaveStep: %v", err)
	}
	leaseUntil, _ := strconv.ParseInt(b.record(t, "c", "m")["lease_until_ms"], 10, 64)
	deadline := time.Now().Add(10 * time.Second)
	polls := 0
	for {
		polls++
		r := b.acquire(t, "c", "m", fp("p"), lease)
		if r.Acquired {
			if r.Token != 2 || r.Attempt != 2 {
				t.Errorf("takeover: token %d, attempt %d; want 2 and 2", r.Token, r.Attempt)
			}
			if got := string(r.Steps["charge"]); got != "ch_1" || len(r.Steps) != 1 {
				t.Errorf("takeover: steps %q, want charge=ch_1", r.Steps)
			}
			takenAt, _ := strconv.ParseInt(b.record(t, "c", "m")["updated_ms"], 10, 64)
			if takenAt < leaseUntil {
				t.Errorf("taken over at %d ms, before the lease ended at %d ms", takenAt, leaseUntil)
			}
			break
		}
		if r.State != idemdriver.StateInProgress || r.LeaseRemaining <= 0 || r.LeaseRemaining > lease {
			t.Fatalf("poll %d before the takeover: state %v, LeaseRemaining %v; want in_progress and (0, %v]", polls, r.State, r.LeaseRemaining, lease)
		}
		if time.Now().After(deadline) {
			t.Fatalf("a %v lease did not run out in 10s (%d polls)", lease, polls)
		}
	}
}

// One time unit, milliseconds, end to end. The stored lease is
// exactly the lease in milliseconds (rounded up, never to zero), no key
// gets a TTL (no EX anywhere), and at the boundaries a lease ending one
// minute from now is live with about a minute left, a lease ending now
// has run out, and so has one that ended a millisecond ago.
func TestTimeUnits(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i, tt := range []struct {
		lease time.Duration
		want  int64
	}{
		{1500 * time.Millisecond, 1500},
		{time.Millisecond, 1},
		{time.Nanosecond, 1},
		{999 * time.Microsecond, 1},
		{1001 * time.Microsecond, 2},
		{time.Second, 1000},
		{longLease, 600000},
		{math.MaxInt64, math.MaxInt64/1_000_000 + 1},
	} {
		if got := idemredis.CeilMillis(tt.lease); got != tt.want {
			t.Errorf("CeilMillis(%v) = %d, want %d", tt.lease, got, tt.want)
		}
		if tt.lease == math.MaxInt64 {
			continue // not stored: a lease of 292 years
		}
		id := fmt.Sprintf("m-%d", i)
		b.mustAcquire(t, "c", id, fp("p"), tt.lease, 1)
		r := b.record(t, "c", id)
		until, _ := strconv.ParseInt(r["lease_until_ms"], 10, 64)
		created, _ := strconv.ParseInt(r["created_ms"], 10, 64)
		if until-created != tt.want {
			t.Errorf("lease %v stored as %d ms, want %d", tt.lease, until-created, tt.want)
		}
		if now := b.serverMillis(t); created < now-60_000 || created > now+1000 {
			t.Errorf("created_ms %d is not the server's now in milliseconds (%d)", created, now)
		}
		if ttl := b.client.PTTL(b.ctx, b.store.RecordKey("c", id)).Val(); ttl != -1 {
			t.Errorf("record key has a TTL %v, want none", ttl)
		}
	}

	setLease := func(id string, offset int64) {
		t.Helper()
		script := redis.NewScript(`local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'lease_until_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1]))
return 1`)
		if err := script.Run(b.ctx, b.client, []string{b.store.RecordKey("c", id)}, offset).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b.mustAcquire(t, "c", "live", fp("p"), longLease, 1)
	setLease("live", 60_000)
	r := b.acquire(t, "c", "live", fp("p"), longLease)
	if r.Acquired || r.LeaseRemaining <= 59*time.Second || r.LeaseRemaining > time.Minute {
		t.Errorf("lease ending in 60000 ms: acquired %v, LeaseRemaining %v; want live with (59s, 1m] left", r.Acquired, r.LeaseRemaining)
	}
	for _, offset := range []int64{0, -1, -30_000} {
		id := fmt.Sprintf("ended%d", offset)
		b.mustAcquire(t, "c", id, fp("p"), longLease, 1)
		setLease(id, offset)
		if r := b.acquire(t, "c", id, fp("p"), longLease); !r.Acquired || r.Attempt != 2 {
			t.Errorf("lease that ended %d ms from now: acquired %v, attempt %d; want taken over as attempt 2", offset, r.Acquired, r.Attempt)
		}
	}
}

// A token that no longer owns the record (taken over, released,
// completed) is refused on every write with ErrLeaseLost, and the record
// and its steps are left exactly as they were.
func TestStaleTokenRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	writes := func(token int64) map[string]func() error {
		return map[string]func() error{
			"Renew": func() error {
				return b.store.Renew(b.ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: token, Lease: longLease})
			},
			"SaveStep": func() error {
				return b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: token, Step: "stale", Result: []byte("x")})
			},
			"Complete": func() error {
				return b.store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: token, Result: []byte("stale")})
			},
			"Release": func() error {
				return b.store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: token, Error: "stale", Terminal: true})
			},
			"ReleaseRetry": func() error {
				return b.store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: token, Error: "stale"})
			},
		}
	}
	steps := func() map[string]string {
		return b.client.HGetAll(b.ctx, b.store.RecordKey("c", "m")+idemredis.StepsSuffix).Val()
	}
	check := func(what string, token int64, wantWhy string) {
		t.Helper()
		before, beforeSteps := b.record(t, "c", "m"), steps()
		for name, w := range writes(token) {
			err := w()
			if !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("%s: %s with token %d = %v, want ErrLeaseLost", what, name, token, err)
			} else if !strings.Contains(err.Error(), wantWhy) {
				t.Errorf("%s: %s error %q does not say %q", what, name, err, wantWhy)
			}
		}
		if after := b.record(t, "c", "m"); !maps.Equal(before, after) {
			t.Errorf("%s: stale writes changed the record:\nbefore %q\nafter  %q", what, before, after)
		}
		if after := steps(); !maps.Equal(beforeSteps, after) {
			t.Errorf("%s: stale writes changed the steps: %q, then %q", what, beforeSteps, after)
		}
	}

	check("no record", 1, "no longer exists")
	a1 := b.mustAcquire(t, "c", "m", fp("p"), longLease, 1)
	if err := b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a1.Token, Step: "s1", Result: []byte("v1")}); err != nil {
		t.Fatal(err)
	}
	check("a token never issued", a1.Token+1, "took over")
	if err := b.store.ExpireLease(b.ctx, "c", "m"); err != nil {
		t.Fatal(err)
	}
	a2 := b.mustAcquire(t, "c", "m", fp("p"), longLease, 2)
	check("after a takeover", a1.Token, "took over")
	if err := b.store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: a2.Token, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	check("after its release", a2.Token, "released")
	a3 := b.mustAcquire(t, "c", "m", fp("p"), longLease, 3)
	b.complete(t, "c", "m", a3.Token, []byte("r"), "")
	check("after completion", a3.Token, "completed")
	check("an older token after completion", a1.Token, "completed")
}

// Recovery points survive expiries, releases and takeovers, byte for
// byte; a step saved twice keeps its first result.
func TestStepsKeptAcrossAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	want := map[string][]byte{}
	token := b.mustAcquire(t, "c", "m", fp("p"), longLease, 1).Token
	for attempt := 1; attempt <= 4; attempt++ {
		name := fmt.Sprintf("step-%d {%%}", attempt)
		res := []byte{0, byte(attempt), 0xff, '}'}
		for _, r := range [][]byte{res, []byte("second save ignored")} {
			if err := b.store.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: token, Step: name, Result: r}); err != nil {
				t.Fatalf("attempt %d: SaveStep: %v", attempt, err)
			}
		}
		want[name] = res
		if attempt%2 == 1 {
			if err := b.store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: token, Error: "retry"}); err != nil {
				t.Fatal(err)
			}
		} else if err := b.store.ExpireLease(b.ctx, "c", "m"); err != nil {
			t.Fatal(err)
		}
		next := b.mustAcquire(t, "c", "m", fp("p"), longLease, attempt+1)
		if next.Token <= token {
			t.Errorf("attempt %d: token %d, want more than %d", attempt+1, next.Token, token)
		}
		token = next.Token
		if !maps.EqualFunc(next.Steps, want, bytes.Equal) {
			t.Errorf("attempt %d: steps %q, want %q", attempt+1, next.Steps, want)
		}
	}
}

// Results are stored and returned byte for byte: binary, empty, nil and
// 1 MiB, with their content types; the hash holds exactly those bytes.
func TestResultsByteExact(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mib := make([]byte, 1<<20)
	for i := range mib {
		mib[i] = byte(i*7 + i>>8)
	}
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	for i, tt := range []struct {
		body  []byte
		ctype string
	}{
		{nil, ""},
		{[]byte{}, "text/plain"},
		{every, "application/octet-stream"},
		{[]byte("\x00\r\n\xff{}%7B"), "a/b; q=\"1\""},
		{mib, "application/octet-stream"},
	} {
		id := fmt.Sprintf("m-%d", i)
		a := b.mustAcquire(t, "c", id, fp("p"), longLease, 1)
		b.complete(t, "c", id, a.Token, tt.body, tt.ctype)
		r := b.acquire(t, "c", id, fp("p"), longLease)
		if r.State != idemdriver.StateCompleted || !bytes.Equal(r.Result, tt.body) || r.ContentType != tt.ctype || r.Result == nil {
			t.Errorf("%s: state %v, result %d bytes (equal %v, nil %v), content type %q; want completed, %d bytes, %q",
				id, r.State, len(r.Result), bytes.Equal(r.Result, tt.body), r.Result == nil, tt.ctype, len(tt.body), tt.ctype)
		}
		if raw := b.record(t, "c", id)["result"]; raw != string(tt.body) {
			t.Errorf("%s: stored result is %d bytes, want %d", id, len(raw), len(tt.body))
		}
	}
}

// Completion updates fields and keeps the fingerprint (and attempt, created time and steps), so after a
// restart (a new Store and consumer, nothing cached) the same payload is
// a Duplicate and another payload a FingerprintMismatch.
func TestCompleteKeepsFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, err := idem.NewLeaseConsumer(b.store, idem.Config{Name: "orders", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := idem.Message{ID: "order-1", Payload: []byte(`{"amount":200}`)}
	h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		if _, err := a.Step(ctx, "charge", func(context.Context) ([]byte, error) { return []byte("ch_1"), nil }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Body: []byte("R1"), ContentType: "text/plain"}, nil
	}
	before := b.record(t, "orders", msg.ID) // empty
	if out, err := c.Process(b.ctx, msg, h); out.Status != idem.Processed || err != nil {
		t.Fatalf("first delivery: %v, %v", out.Status, err)
	}
	after := b.record(t, "orders", msg.ID)
	if len(before) != 0 || after["fingerprint"] != string(fp(string(msg.Payload))) || after["state"] != "2" || after["attempt"] != "1" || after["created_ms"] == "" {
		t.Errorf("completed record %q: want state 2, the fingerprint, attempt 1 and created_ms kept", after)
	}
	if steps, err := b.store.Steps(b.ctx, "orders", msg.ID); err != nil || len(steps) != 1 || steps[0].Name != "charge" || string(steps[0].Result) != "ch_1" {
		t.Errorf("steps after completion: %q, %v; want charge=ch_1 kept", steps, err)
	}

	restarted, err := idemredis.New(b.client, &idemredis.Config{Prefix: b.prefix})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := idem.NewLeaseConsumer(restarted, idem.Config{Name: "orders", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	var calls atomic.Int64
	never := func(context.Context, *idem.Attempt) (idem.Result, error) { calls.Add(1); return idem.Result{}, nil }
	out, err := c2.Process(b.ctx, msg, never)
	if out.Status != idem.Duplicate || err != nil || string(out.Result) != "R1" || out.ContentType != "text/plain" {
		t.Errorf("identical redelivery after a restart: %v %q %q, %v; want Duplicate with R1", out.Status, out.Result, out.ContentType, err)
	}
	out, err = c2.Process(b.ctx, idem.Message{ID: msg.ID, Payload: []byte(`{"amount":500}`)}, never)
	if out.Status != idem.FingerprintMismatch || !errors.Is(err, idem.ErrFingerprintMismatch) || len(out.Result) != 0 {
		t.Errorf("another payload after a restart: %v %q, %v; want FingerprintMismatch without the result", out.Status, out.Result, err)
	}
	if calls.Load() != 0 {
		t.Errorf("handler ran %d times after completion, want 0", calls.Load())
	}
}

// keySlot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of its hash
// tag, or of the whole key when it has none, modulo 16384.
func keySlot(key string) int { return int(crc16(hashTag(key)) % 16384) }

// hashTag returns what Redis Cluster hashes: the text between the first
// '{' and the first '}' after it when that is not empty, else the key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

func TestKeySlot(t *testing.T) {
	t.Parallel()
	// Vectors from the Redis Cluster specification.
	if got := crc16("123456789"); got != 0x31c3 {
		t.Errorf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, tag := range map[string]string{
		"{user1000}.following": "user1000",
		"foo{}{bar}":           "foo{}{bar}",
		"foo{{bar}}zap":        "{bar",
		"foo{bar}{zap}":        "bar",
		"plain":                "plain",
	} {
		if got := hashTag(key); got != tag {
			t.Errorf("hashTag(%q) = %q, want %q", key, got, tag)
		}
	}
}

// Keys: consumer names and message IDs with braces, percent signs,
// separators and control bytes (which the store escapes even though idem
// rejects them before it) make well-formed hash tags, all of one record's
// keys share a slot, and distinct records never share keys, so each keeps
// its own result. IDs differing in case only are distinct.
func TestKeyEncoding(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pairs := [][2]string{
		{"c", "{"}, {"c", "}"}, {"c", "{}"}, {"c", "}{"}, {"c", "a}b{c"}, {"c", "{a}"},
		{"c", "%7B"}, {"c", "%7D"}, {"c", "%"}, {"c", "%25"},
		{"c", "Order-1"}, {"c", "order-1"}, {"c", "ORDER-1"},
		{"c", "a:b"}, {"c", "a|b"}, {"c", "a\x1fb"}, {"c", "a%1Fb"}, {"c", "\u00e9"}, {"c", "e\u0301"},
		{"c", ":steps"}, {"c", "m}:steps"}, {"c", "*?[x]\\"},
		{"a\x1fb", "c"}, {"a", "b\x1fc"}, {"a", "b"}, {"a{", "b"}, {"a", "{b"},
		{"{c}", "m"}, {"c}", "m"}, {"C", "m"}, {"c:done", "m"}, {"c", "done"},
		{"c", strings.Repeat("}", 255)}, {strings.Repeat("{", 255), "m"},
	}
	keys := map[string][2]string{}
	for i, p := range pairs {
		rk := b.store.RecordKey(p[0], p[1])
		owned := []string{rk, rk + idemredis.StepsSuffix}
		if strings.Count(rk, "{") != 1 || strings.Count(rk, "}") != 1 || !strings.HasSuffix(rk, "}") || !strings.HasPrefix(rk, b.prefix+"{") {
			t.Errorf("%q: record key %q is not prefix{tag} with one brace pair", p, rk)
		}
		for _, k := range owned {
			if keySlot(k) != keySlot(rk) {
				t.Errorf("%q: key %q in slot %d, the record in %d", p, k, keySlot(k), keySlot(rk))
			}
		}
		ck := b.store.ConsumerKey(p[0], idemredis.DoneSuffix)
		if strings.Count(ck, "{") != 1 || strings.Count(ck, "}") != 1 || hashTag(ck) == hashTag(rk) {
			t.Errorf("%q: consumer key %q malformed or in the record's tag", p, ck)
		}
		if keySlot(ck) != keySlot(b.store.ConsumerKey(p[0], idemredis.PurgeSuffix)) || keySlot(ck) != keySlot(b.store.ConsumerKey(p[0], idemredis.RunsSuffix)) {
			t.Errorf("%q: the consumer's index, runs and lock are in different slots", p)
		}
		for _, k := range append(owned, ck) {
			if other, dup := keys[k]; dup && other != p && !strings.HasSuffix(k, idemredis.DoneSuffix) {
				t.Errorf("%q and %q share the key %q", p, other, k)
			}
			keys[k] = p
		}
		if !validPair(p) {
			// Keys are well formed for any bytes, but the store refuses
			// names that break idem's ID rules, as every store does.
			_, err := b.store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: p[0], MessageID: p[1], Fingerprint: fp("same payload"), Lease: longLease})
			if !errors.Is(err, idem.ErrInvalidMessageID) && !errors.Is(err, idem.ErrInvalidConsumerName) {
				t.Errorf("%q: Acquire = %v, want ErrInvalidMessageID or ErrInvalidConsumerName", p, err)
			}
			continue
		}
		a := b.mustAcquire(t, p[0], p[1], fp("same payload"), longLease, 1)
		b.complete(t, p[0], p[1], a.Token, []byte(fmt.Sprintf("result %d", i)), "")
	}
	wantC := 0
	for i, p := range pairs {
		if !validPair(p) {
			continue
		}
		if p[0] == "c" {
			wantC++
		}
		r := b.acquire(t, p[0], p[1], fp("same payload"), longLease)
		if want := fmt.Sprintf("result %d", i); r.State != idemdriver.StateCompleted || string(r.Result) != want {
			t.Errorf("%q: state %v, result %q; want completed with %q (keys collide?)", p, r.State, r.Result, want)
		}
	}
	if got, err := b.store.CountRecords(b.ctx, "c"); err != nil || got != wantC {
		t.Errorf("CountRecords(c) = %d, %v; want %d", got, err, wantC)
	}
}

// validPair reports whether consumer and message ID follow idem's rules.
func validPair(p [2]string) bool {
	return idem.ValidateConsumerName(p[0]) == nil && idem.ValidateMessageID(p[1], 0) == nil
}

// An end-to-end run through idem.LeaseConsumer: a payment whose first
// attempt charges and fails, a redelivery that resumes after the charge
// step, duplicates, a concurrent copy while the handler runs, a poison
// message, and the consumer's purge.
func TestLeaseConsumerEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, err := idem.NewLeaseConsumer(b.store, idem.Config{Name: "payments", Lease: 3 * time.Second, MaxAttempts: 2, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var charges atomic.Int64
	var mu sync.Mutex
	keys := map[string]bool{}
	inHandler, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	handler := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		id, err := a.Step(ctx, "charge", func(context.Context) ([]byte, error) {
			charges.Add(1)
			mu.Lock()
			keys[a.Key("charge")] = true
			mu.Unlock()
			return []byte("ch_" + a.Message.ID), nil
		})
		if err != nil {
			return idem.Result{}, err
		}
		if a.Number == 1 {
			return idem.Result{}, errors.New("provider timeout")
		}
		once.Do(func() { close(inHandler); <-release })
		return idem.Result{Body: id, ContentType: "text/plain"}, nil
	}
	msg := idem.Message{ID: "pay-1", Payload: []byte(`{"amount":100}`)}
	out, err := c.Process(b.ctx, msg, handler)
	if out.Status != idem.Failed || out.Poison || err == nil {
		t.Fatalf("attempt 1: %v poison %v, %v; want Failed, retryable", out.Status, out.Poison, err)
	}
	done := make(chan idem.Outcome, 1)
	go func() {
		out, _ := c.Process(b.ctx, msg, handler)
		done <- out
	}()
	<-inHandler
	if out, err := c.Process(b.ctx, msg, handler); out.Status != idem.InProgress || !errors.Is(err, idem.ErrInProgress) || out.RetryAfter <= 0 || out.RetryAfter > 3*time.Second {
		t.Errorf("copy while attempt 2 runs: %v RetryAfter %v, %v; want InProgress within the lease", out.Status, out.RetryAfter, err)
	}
	close(release)
	if out := <-done; out.Status != idem.Processed || out.Attempt != 2 || string(out.Result) != "ch_pay-1" {
		t.Errorf("attempt 2: %v attempt %d result %q; want Processed, 2, ch_pay-1", out.Status, out.Attempt, out.Result)
	}
	for range 3 {
		if out, err := c.Process(b.ctx, msg, handler); out.Status != idem.Duplicate || err != nil || string(out.Result) != "ch_pay-1" {
			t.Errorf("redelivery: %v %q, %v; want Duplicate ch_pay-1", out.Status, out.Result, err)
		}
	}
	if charges.Load() != 1 || len(keys) != 1 || !keys[idem.DeriveKey("payments", "pay-1", "charge")] {
		t.Errorf("charges %d with keys %v; want 1 with the derived key", charges.Load(), keys)
	}

	poison := idem.Message{ID: "pay-poison", Payload: []byte("p")}
	boom := func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, errors.New("declined")
	}
	for n := 1; n <= 3; n++ {
		out, err := c.Process(b.ctx, poison, boom)
		if wantPoison := n >= 2; out.Poison != wantPoison || (wantPoison && !errors.Is(err, idem.ErrPoison)) {
			t.Errorf("poison delivery %d: %v poison %v, %v", n, out.Status, out.Poison, err)
		}
	}
	// The poison record was written 8 days ago, and the consumer has been
	// running since: it goes, and pay-1 (written just now) stays.
	if err := b.store.AgeRecords(b.ctx, "payments", []string{"pay-poison"}, 8*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(b.serverMillis(t))
	if err := b.store.AddRun(b.ctx, "payments", now.Add(-9*24*time.Hour), now); err != nil {
		t.Fatal(err)
	}
	res, err := c.Purge(b.ctx)
	if err != nil || res.Deleted != 1 {
		t.Errorf("consumer purge: %+v, %v; want the aged poison record deleted", res, err)
	}
	if n, _ := b.store.CountRecords(b.ctx, "payments"); n != 1 {
		t.Errorf("records after the purge: %d, want 1", n)
	}
}

// A Complete whose reply was lost is retried by the core: the same
// completion repeated by the same token succeeds and changes nothing,
// while a different one (another result or content type) is refused as a
// lost lease. Both on the single-server script and through the cluster
// path.
func TestCompleteRepeatedAfterLostReply(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	res, err := b.store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m-1", Fingerprint: fp("p"), Lease: time.Minute})
	if err != nil || !res.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	done := &idemdriver.CompleteParams{Consumer: "c", MessageID: "m-1", Token: res.Token, Result: []byte("R1"), ContentType: "text/plain"}
	if err := b.store.Complete(b.ctx, done); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	first := b.record(t, "c", "m-1")
	if err := b.store.Complete(b.ctx, done); err != nil {
		t.Errorf("the same Complete again: %v, want nil", err)
	}
	if again := b.record(t, "c", "m-1"); !maps.Equal(first, again) {
		t.Errorf("record after the repeat %q, want it unchanged %q", again, first)
	}
	for _, other := range []idemdriver.CompleteParams{
		{Consumer: "c", MessageID: "m-1", Token: res.Token, Result: []byte("R2"), ContentType: "text/plain"},
		{Consumer: "c", MessageID: "m-1", Token: res.Token, Result: []byte("R1"), ContentType: "application/json"},
		{Consumer: "c", MessageID: "m-1", Token: res.Token + 1, Result: []byte("R1"), ContentType: "text/plain"},
	} {
		if err := b.store.Complete(b.ctx, &other); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Complete %q %q token %d of the completed record: %v, want ErrLeaseLost", other.Result, other.ContentType, other.Token, err)
		}
	}
	if again := b.record(t, "c", "m-1"); !maps.Equal(first, again) {
		t.Errorf("record after the refused completions %q, want it unchanged %q", again, first)
	}
}
