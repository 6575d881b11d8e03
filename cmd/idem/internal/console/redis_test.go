package console_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
)

// On a Redis store, which keeps no list of its consumers, the front page
// asks for a consumer's name (200) and the form leads to its failures;
// the JSON list stays 501.
func TestFrontPageAsksForConsumerOnRedis(t *testing.T) {
	opts, err := redis.ParseURL(testenv.URL(t, "IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	prefix := "console:" + suffix() + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
		_ = rdb.Close()
	})
	st, err := idemredis.New(rdb, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewLeaseConsumer(st, idem.Config{Name: "payments", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Process(t.Context(), idem.Message{ID: "pay-1"}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, idem.Permanent(errors.New("card declined"))
	})
	if !errors.Is(err, idem.ErrPermanent) {
		t.Fatalf("Process: %v, want a permanent failure", err)
	}

	f := newFixture(t, st, console.Config{})
	code, body, _ := f.get("/")
	if code != http.StatusOK || !strings.Contains(body, `id="unlisted"`) ||
		!strings.Contains(body, `action="/failed"`) || !strings.Contains(body, `name="consumer"`) {
		t.Fatalf("front page on Redis: %d %s", code, body)
	}
	if strings.Contains(body, "<script") {
		t.Errorf("the page has a script: %s", body)
	}
	// What the form submits.
	code, body, _ = f.get("/failed?consumer=payments")
	if code != http.StatusOK || !strings.Contains(body, "pay-1") || !strings.Contains(body, "card declined") {
		t.Errorf("failed page from the form: %d %s", code, body)
	}
	if code, body, _ := f.get("/api/consumers"); code != http.StatusNotImplemented {
		t.Errorf("api/consumers on Redis: %d %s, want 501", code, body)
	}
}
