package idemredis

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestScriptInstructions counts the Redis server's instructions per
// lease-mode message (acquire with a run point, then complete with the
// retention index, on fresh keys) for this build's scripts and for
// reference scripts: a hand-written fenced lease (hand), the same with a
// fingerprint and a retention index (handidx) and two scripts that
// return at once (empty). It needs a redis-server of its own run under
// valgrind's callgrind, and skips without one:
//
//	valgrind --tool=callgrind --callgrind-out-file=$DIR/callgrind.out.%p \
//	  redis-server --port 25380 --save '' --appendonly no --hz 1 &
//	IDEM_CALLGRIND_REDIS=redis://127.0.0.1:25380/0 IDEM_CALLGRIND_PID=$! IDEM_CALLGRIND_DIR=$DIR \
//	  go test -run TestScriptInstructions -v
//
// Each variant runs on an emptied server (FLUSHALL, so that no variant
// pays another's dictionary growth), 500 messages after 10 of warm-up,
// between callgrind_control -z and -d, in 3 rounds; it logs the
// thousands of user-space instructions per message of each round. The
// server's data is flushed: never point it at a server in use.
func TestScriptInstructions(t *testing.T) {
	url, pid, dir := os.Getenv("IDEM_CALLGRIND_REDIS"), os.Getenv("IDEM_CALLGRIND_PID"), os.Getenv("IDEM_CALLGRIND_DIR")
	if url == "" || pid == "" || dir == "" {
		t.Skip("set IDEM_CALLGRIND_REDIS, IDEM_CALLGRIND_PID and IDEM_CALLGRIND_DIR (see the doc comment)")
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	fpr := "0123456789abcdef0123456789abcdef"
	result := strings.Repeat("r", 120)
	type variant struct {
		name, acq, comp string
		acqArgs         func(i int) ([]string, []any)
		compArgs        func(i int) ([]string, []any)
	}
	idem := variant{name: "idem", acq: acquireLua, comp: completeIndexLua,
		acqArgs: func(i int) ([]string, []any) {
			k := fmt.Sprintf("cg:{c\x1fm%d}", i)
			return []string{k, k + stepsSuffix}, []any{fpr, 30000, "idemhttp:run:"}
		},
		compArgs: func(i int) ([]string, []any) {
			return []string{fmt.Sprintf("cg:{c\x1fm%d}", i), "cg:{c}:done"}, []any{1, result, "application/x-idem", fmt.Sprintf("m%d", i)}
		}}
	hand := func(name, acq, comp string) variant {
		return variant{name: name, acq: acq, comp: comp,
			acqArgs: func(i int) ([]string, []any) {
				return []string{fmt.Sprintf("cg:%s:%d", name, i)}, []any{30000, fpr}
			},
			compArgs: func(i int) ([]string, []any) {
				return []string{fmt.Sprintf("cg:%s:%d", name, i), "cg:" + name + ":done"}, []any{1, result, fmt.Sprintf("m%d", i)}
			}}
	}
	variants := []variant{
		idem,
		hand("hand", HandAcquireLua, HandCompleteLua),
		hand("handidx", HandIdxAcquireLua, HandIdxCompleteLua),
		{name: "empty", acq: "return 1", comp: "return 1",
			acqArgs:  func(i int) ([]string, []any) { return []string{"e"}, []any{fpr, 30000, "idemhttp:run:"} },
			compArgs: func(i int) ([]string, []any) { return []string{"e", "d"}, []any{1, result, "x", "m"} }},
	}
	const rounds, n = 3, 500
	res := map[string][]float64{}
	for r := range rounds {
		for _, v := range variants {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			as, cs := redis.NewScript(v.acq), redis.NewScript(v.comp)
			for i := range 10 {
				k, a := v.acqArgs(1_000_000 + i)
				if err := as.Run(ctx, c, k, a...).Err(); err != nil {
					t.Fatal(v.name, err)
				}
				k, a = v.compArgs(1_000_000 + i)
				if err := cs.Run(ctx, c, k, a...).Err(); err != nil {
					t.Fatal(v.name, err)
				}
			}
			callgrindControl(t, "-z", pid)
			for i := range n {
				k, a := v.acqArgs(i)
				if err := as.Run(ctx, c, k, a...).Err(); err != nil {
					t.Fatal(v.name, err)
				}
				k, a = v.compArgs(i)
				if n, err := cs.Run(ctx, c, k, a...).Int64(); err != nil || n != 1 {
					t.Fatalf("%s complete: %d %v", v.name, n, err)
				}
			}
			callgrindControl(t, "-d", pid)
			res[v.name] = append(res[v.name], lastDumpInstructions(t, dir, pid)/n/1000)
		}
		t.Logf("round %d of %d done", r+1, rounds)
	}
	for _, v := range variants {
		t.Logf("%-8s k instructions/message: %.1f", v.name, res[v.name])
	}
}

func callgrindControl(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("callgrind_control", args...).CombinedOutput(); err != nil {
		t.Fatalf("callgrind_control %v: %v %s", args, err, out)
	}
}

// lastDumpInstructions reads the instruction total of pid's newest dump in dir.
func lastDumpInstructions(t *testing.T, dir, pid string) float64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "callgrind.out."+pid+".*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no callgrind dump of %s in %s: %v", pid, dir, err)
	}
	num := func(f string) int { n, _ := strconv.Atoi(f[strings.LastIndexByte(f, '.')+1:]); return n }
	newest := slices.MaxFunc(files, func(a, b string) int { return num(a) - num(b) })
	b, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^(?:summary|totals): (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no instruction total in %s", newest)
	}
	total, _ := strconv.ParseFloat(string(m[1]), 64)
	return total
}

// The hand-written fenced leases of BenchmarkLeaseVsTwoStepSET (its
// hand and handidx contenders; see there) and TestScriptInstructions.
// HandAcquireLua: KEYS key; ARGV lease (ms). Answers the key's next
// token when its lease is free (never taken, or ended) and it has no
// result, -1 when another token holds it, and {0, result} when it is
// done. HandCompleteLua: KEYS key; ARGV token, result. Writes the result
// only when token still holds the key: 1; otherwise 0.
// HandIdxAcquireLua and HandIdxCompleteLua are the same with a
// fingerprint and a retention index: HandIdxAcquireLua (KEYS key; ARGV
// lease (ms), fingerprint) also answers -2 for a key whose stored
// fingerprint differs and stores the fingerprint with the lease;
// HandIdxCompleteLua (KEYS key, index; ARGV token, result, member) also
// scores member in the index with the server's now, the result's time.
const (
	HandAcquireLua = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = redis.call('HMGET', KEYS[1], 'token', 'until', 'result')
if r[3] then return {0, r[3]} end
if r[1] and tonumber(r[2]) > now then return -1 end
local token = (tonumber(r[1]) or 0) + 1
redis.call('HSET', KEYS[1], 'token', token, 'until', now + ARGV[1])
return token
`
	HandCompleteLua = `
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'result', ARGV[2], 'until', 0)
return 1
`
	HandIdxAcquireLua = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = redis.call('HMGET', KEYS[1], 'token', 'until', 'result', 'fp')
if r[1] and r[4] ~= ARGV[2] then return -2 end
if r[3] then return {0, r[3]} end
if r[1] and tonumber(r[2]) > now then return -1 end
local token = (tonumber(r[1]) or 0) + 1
redis.call('HSET', KEYS[1], 'token', token, 'until', now + ARGV[1], 'fp', ARGV[2])
return token
`
	HandIdxCompleteLua = `
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('HSET', KEYS[1], 'result', ARGV[2], 'until', now)
return 1
`
)
