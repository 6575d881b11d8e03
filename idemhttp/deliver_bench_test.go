package idemhttp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// nopService answers every request 204 at once, in the process: what is
// left of a delivery is the Deliverer's and the lease engine's own work.
type nopService struct{}

func (nopService) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusNoContent, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// BenchmarkDelivererProcess is one new message through a Deliverer over
// the memory store and a service in the process (no network): the
// Deliverer's and the lease engine's CPU and allocations per message.
//
//	go test -run '^$' -bench BenchmarkDelivererProcess -benchmem ./idemhttp
//
// Sub-benchmark "background" gives each message context.Background (a
// caller that cannot cancel), "adapter" a context with a deadline of its
// own, as the broker adapters' handler timeout makes.
func BenchmarkDelivererProcess(b *testing.B) {
	b.Run("background", func(b *testing.B) { benchmarkDelivererProcess(b, false) })
	b.Run("adapter", func(b *testing.B) { benchmarkDelivererProcess(b, true) })
}

func benchmarkDelivererProcess(b *testing.B, deadline bool) {
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "bench", Lease: 30 * time.Second, PurgeInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer lc.Close()
	target, _ := url.Parse("http://service.test/messages")
	d, err := NewDeliverer(lc, DelivererOptions{Target: target, Transport: nopService{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"order":1,"amount":1000}`)
	headers := map[string][]string{"Content-Type": {"application/json"}, "Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	prefix := strings.Repeat("m", 8)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if deadline {
			ctx, cancel = context.WithTimeout(ctx, time.Minute)
		}
		out, err := d.Process(ctx, idem.Message{ID: prefix + strconv.Itoa(i), Payload: payload, Headers: headers})
		cancel()
		if err != nil || out.Status != idem.Processed {
			b.Fatalf("%v %v", out.Status, err)
		}
	}
}
