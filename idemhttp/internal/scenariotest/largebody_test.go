package scenariotest

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// patternReader yields n bytes of a repeating pattern without holding
// them, and hides its length so the client sends it chunked.
type patternReader struct{ left int64 }

// patternBlock is what patternReader repeats.
var patternBlock = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte('a' + i%26 + i/26%3)
	}
	return b
}()

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	n := copy(b[:min(int64(len(b)), p.left)], patternBlock[p.left%int64(len(patternBlock)):])
	p.left -= int64(n)
	return n, nil
}

// TestH1LargeBodyStreaming is scenario H1 at full size: a 200 MB chunked
// body under a 64 MiB soft memory limit is fingerprinted while it
// streams (spooled to a temporary file), reaches the handler intact, and
// its retry replays; the heap never grows by more than a fraction of the
// body. Not parallel, so the heap measurement is its own.
func TestH1LargeBodyStreaming(t *testing.T) {
	size := int64(200 << 20)
	if testing.Short() {
		size = 32 << 20
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(64 << 20))
	h := sha256.New()
	io.Copy(h, &patternReader{left: size})
	want := fmt.Sprintf("%x", h.Sum(nil))

	var n atomic.Int64
	m, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{
		Namespace: "h1", Scope: scAuthScope, PurgeInterval: -1,
		MaxRequestBytes: 1 << 30, Logger: scQuietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	srv := httptest.NewServer(m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		hh := sha256.New()
		got, _ := io.Copy(hh, r.Body)
		w.WriteHeader(201)
		fmt.Fprintf(w, "%d %x", got, hh.Sum(nil))
	})))
	defer srv.Close()

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()
	send := func() (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/upload", &patternReader{left: size})
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Authorization", "Bearer user-a")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"big"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	start := time.Now()
	r1, b1 := send()
	r2, b2 := send()
	el := time.Since(start)
	close(stop)
	<-sampled
	if r1.StatusCode != 201 || b1 != fmt.Sprintf("%d %s", size, want) {
		t.Fatalf("first: %d %q, want the handler to see %d bytes with SHA-256 %s", r1.StatusCode, b1, size, want)
	}
	if r2.StatusCode != 201 || r2.Header.Get(idemhttp.HeaderReplayed) != "true" || b2 != b1 {
		t.Fatalf("retry: %d %q %q", r2.StatusCode, r2.Header.Get(idemhttp.HeaderReplayed), b2)
	}
	if n.Load() != 1 {
		t.Fatalf("handler ran %d times", n.Load())
	}
	growth := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("2 x %d MiB in %v; heap in use grew by at most %.1f MiB", size>>20, el, float64(growth)/(1<<20))
	if growth > 24<<20 {
		t.Fatalf("heap grew by %d MiB for a %d MiB body", growth>>20, size>>20)
	}
}
