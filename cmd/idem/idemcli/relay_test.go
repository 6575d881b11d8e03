package idemcli

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testenv"
)

// TestRelayToRedisStreams runs `idem relay` on a SQLite store with two rows
// written into the outbox table by another program: both reach the stream,
// with their IDs in the message-id field and their headers as fields, and
// are marked sent; the command returns nil when its context ends.
func TestRelayToRedisStreams(t *testing.T) {
	url := serviceURL(t, "IDEM_TEST_REDIS_URL")
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	if code, _, stderr := run(t, "migrate", "--store", storeURL); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	stream := fmt.Sprintf("idem-test-relay-%d", time.Now().UnixNano())
	db, err := sql.Open("sqlite", strings.TrimPrefix(storeURL, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := 1; i <= 2; i++ {
		if _, err := db.Exec(`INSERT INTO idem_processed_outbox (id, destination, order_key, payload, headers) VALUES (?, ?, 'k', ?, '{"trace":"t1"}')`,
			fmt.Sprintf("order-%d-created", i), stream, []byte(fmt.Sprintf("p%d", i))); err != nil {
			t.Fatalf("insert: %v", err)
		}
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })

	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut strings.Builder
	root := newRoot(&out, &lockedWriter{w: &errOut})
	root.SetArgs([]string{"relay", "--store", storeURL, "--broker", url})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("idem relay: %v (stderr %s)", err, errOut.String())
		}
	}()

	var entries []redis.XMessage
	testenv.Eventually(t, 60*time.Second, "both rows in the stream and marked sent", func() bool {
		entries, err = rdb.XRange(context.Background(), stream, "-", "+").Result()
		var unsent int
		_ = db.QueryRow(`SELECT COUNT(*) FROM idem_processed_outbox WHERE sent_at IS NULL`).Scan(&unsent)
		return err == nil && len(entries) == 2 && unsent == 0
	}, func() string { return fmt.Sprintf("%d entries (%v)", len(entries), err) })
	for i, e := range entries {
		if e.Values["message-id"] != fmt.Sprintf("order-%d-created", i+1) || e.Values["trace"] != "t1" || e.Values["payload"] != fmt.Sprintf("p%d", i+1) {
			t.Errorf("entry %d: %v", i, e.Values)
		}
	}
}
