package idemcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
)

// TestOperateRedis: the operator commands and the console on a Redis
// store. A LeaseConsumer fails a message for good; failed lists it,
// inspect shows it with its error, retry makes it retryable once (the
// second says nothing changed), and the console's failed and message
// pages show it. No output holds a password.
func TestOperateRedis(t *testing.T) {
	t.Parallel()
	base := serviceURL(t, "IDEM_TEST_REDIS_URL")
	ctx := t.Context()
	prefix := fmt.Sprintf("idemtest-ops-%d:", time.Now().UnixNano())
	opts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { dropPrefix(t, rdb, prefix); rdb.Close() })
	st, err := idemredis.New(rdb, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewLeaseConsumer(st, idem.Config{Name: "payments"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Process(ctx, idem.Message{ID: "pay-1", Payload: []byte(`{"n":1}`)}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, idem.Permanent(errors.New("card declined"))
	})
	if !errors.Is(err, idem.ErrPermanent) {
		t.Fatalf("Process: %v, want a permanent failure", err)
	}

	cmd := func(args ...string) (int, string, string) {
		t.Helper()
		code, stdout, stderr := run(t, append(args, "--store", base, "--redis-prefix", prefix, "--consumer", "payments")...)
		return code, stdout, stderr
	}
	code, stdout, stderr := cmd("failed", "--json")
	var page console.RecordPageView
	if code != 0 || json.Unmarshal([]byte(stdout), &page) != nil || len(page.Records) != 1 ||
		page.Records[0].MessageID != "pay-1" || page.Records[0].Error != "card declined" || page.Records[0].State != "failed" {
		t.Fatalf("failed: exit %d, %q %q", code, stdout, stderr)
	}
	if code, stdout, stderr = cmd("inspect", "--id", "pay-1"); code != 0 || !strings.Contains(stdout, "failed") || !strings.Contains(stdout, "card declined") {
		t.Errorf("inspect: exit %d, %q %q", code, stdout, stderr)
	}
	if code, stdout, stderr = cmd("failed", "--in-progress"); code == 0 || !strings.Contains(stderr, "no index of the records in progress") {
		t.Errorf("failed --in-progress: exit %d, %q %q, want refused", code, stdout, stderr)
	}
	if code, stdout, stderr = cmd("failed", "--table", "t"); code != 2 || !strings.Contains(stderr, "--redis-prefix") {
		t.Errorf("failed --table on Redis: exit %d, %q %q, want a usage error", code, stdout, stderr)
	}

	for i, want := range []bool{true, false} {
		var v console.ActionView
		code, stdout, stderr = cmd("retry", "--id", "pay-1", "--json")
		if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v.Changed != want || v.Record == nil || v.Record.State != "in_progress" {
			t.Errorf("retry %d: exit %d, %q %q, want changed %v and the record in progress", i+1, code, stdout, stderr, want)
		}
	}
	if code, stdout, stderr = cmd("inspect", "--id", "pay-1", "--json"); code != 0 || !strings.Contains(stdout, `"in_progress"`) {
		t.Errorf("inspect after retry: exit %d, %q %q", code, stdout, stderr)
	}
	if code, stdout, stderr = cmd("failed", "--json"); code != 0 || strings.Contains(stdout, "pay-1") {
		t.Errorf("failed after retry: exit %d, %q %q, want no record", code, stdout, stderr)
	}
	if code, _, stderr = cmd("inspect", "--id", "pay-2"); code != 1 || !strings.Contains(stderr, `no record of message "pay-2"`) {
		t.Errorf("inspect of a missing record: exit %d, %q", code, stderr)
	}

	// A stuck lease: release without --token names the holder's token
	// (read with Inspect); with it, the lease ends once.
	held, err := st.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "payments", MessageID: "pay-9", Fingerprint: []byte("f"), Lease: time.Hour})
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire(pay-9): %+v, %v", held, err)
	}
	tok := strconv.FormatInt(held.Token, 10)
	if code, stdout, stderr = cmd("release", "--id", "pay-9"); code != 2 || !strings.Contains(stderr, "--token "+tok) {
		t.Errorf("release without --token: exit %d, %q %q, want the token %s named", code, stdout, stderr, tok)
	}
	for i, want := range []bool{true, false} {
		var v console.ActionView
		code, stdout, stderr = cmd("release", "--id", "pay-9", "--token", tok, "--json")
		if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v.Changed != want {
			t.Errorf("release %d: exit %d, %q %q, want changed %v", i+1, code, stdout, stderr, want)
		}
	}

	// The console over the store the commands open: fail pay-3 for good.
	if _, err := c.Process(ctx, idem.Message{ID: "pay-3", Payload: []byte("x")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, idem.Permanent(errors.New("bad account"))
	}); !errors.Is(err, idem.ErrPermanent) {
		t.Fatalf("Process(pay-3): %v", err)
	}
	opened, err := openOperated(ctx, base, "", prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	srv, err := console.New(console.Config{Store: opened.Store, Where: opened.Where})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/api/failed?consumer=payments"); code != http.StatusOK ||
		json.Unmarshal([]byte(body), &page) != nil || len(page.Records) != 1 || page.Records[0].MessageID != "pay-3" {
		t.Errorf("/api/failed: %d %s", code, body)
	}
	var msg console.MessageView
	if code, body := get("/api/message?consumer=payments&id=pay-3"); code != http.StatusOK ||
		json.Unmarshal([]byte(body), &msg) != nil || msg.State != "failed" || msg.Error != "bad account" || msg.Attempt != 1 {
		t.Errorf("/api/message: %d %s", code, body)
	}
	if code, body := get("/api/failed?consumer=payments&state=in_progress"); code != http.StatusNotImplemented {
		t.Errorf("/api/failed in progress: %d %s, want 501", code, body)
	}

	// A password never shows: not for a server that refuses it, a URL
	// that does not parse, or a server that does not answer (go-redis
	// retries its dials: one command each).
	const pw = "pw-hunter2-redis"
	commands := [][]string{{"failed", "--consumer", "c"}, {"inspect", "--consumer", "c", "--id", "m"}, {"retry", "--consumer", "c", "--id", "m"}}
	for _, tc := range []struct {
		url  string
		args [][]string
	}{
		{withPassword(t, base, pw), commands},
		{"redis://:" + pw + "@127.0.0.1:1/0?bogus=1", commands},
		{"redis://:" + pw + "@127.0.0.1:1/0", commands[:1]},
		{"rediss://u:" + pw + "@127.0.0.1:1/0", commands[1:2]},
	} {
		for _, args := range tc.args {
			code, stdout, stderr := run(t, append(args, "--store", tc.url)...)
			if code == 0 || strings.Contains(stdout+stderr, pw) {
				t.Errorf("%s on %s: exit %d, output %q %q (must fail without the password)", args[0], redact(tc.url), code, stdout, stderr)
			}
		}
	}
}

// withPassword is raw with the password pw (which the test server does
// not have).
func withPassword(t *testing.T, raw, pw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("idem-nobody", pw)
	return u.String()
}

// dropPrefix deletes the keys under prefix.
func dropPrefix(t *testing.T, rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("dropping %s*: %v", prefix, err)
	}
}
