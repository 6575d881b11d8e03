// Package faultproxy is a TCP proxy for tests that puts network faults
// between a client and a store: it forwards every connection to a target
// address until told to cut the connections as the store answers
// (CutAnswers: the store applies a command and the client never learns
// it did), to stall them (Stall: a half-open connection or a
// black-holed network, on which nothing moves any more and nothing is
// closed), or to slow the store's answers (Slow: a long or congested
// network path). It is internal: not part of idem's API.
package faultproxy

import (
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from Addr to its target. It is safe for
// concurrent use; New registers its shutdown with the test's cleanup.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cutUntil time.Time
	cuts     int
	pairs    map[*pair]bool
	stalled  int
	closed   bool
	slow     time.Duration
}

// pair is one client connection and the proxy's connection to the target.
type pair struct {
	client, server net.Conn
	stall          chan struct{} // closed by Stall
	done           chan struct{} // closed when both are closed
	once           sync.Once
	stallOnce      sync.Once
}

// New starts a proxy on a loopback port that forwards to target
// (host:port), closed with every connection at the end of tb.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, pairs: map[*pair]bool{}}
	tb.Cleanup(p.Close)
	go p.accept()
	return p
}

// URL starts a proxy to the host:port of the store URL raw and returns it
// with raw rewritten to go through it.
func URL(tb testing.TB, raw string) (*Proxy, string) {
	tb.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		tb.Fatalf("faultproxy: cannot take the address of a store URL (%v)", err)
	}
	p := New(tb, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutAnswers starts a window of d during which every answer of the target
// closes its connection instead of reaching the client: the target has
// applied the command (a final write included) and the client never
// learns it did.
func (p *Proxy) CutAnswers(d time.Duration) {
	p.mu.Lock()
	p.cutUntil = time.Now().Add(d)
	p.mu.Unlock()
}

// CutUntil is the end of the last CutAnswers window.
func (p *Proxy) CutUntil() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutUntil
}

// Cuts counts the connections CutAnswers closed.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Stall stops every connection open now, for good: nothing more is
// forwarded either way, and neither end is closed, not even when the
// other end closes its side (a black hole sends no FIN), so the target's
// session lives on until its own timeouts end it. Connections made later
// are forwarded as usual. It returns how many connections it stalled.
func (p *Proxy) Stall() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.pairs {
		c.stallOnce.Do(func() { close(c.stall); n++ })
	}
	p.stalled += n
	return n
}

// Stalled counts the connections Stall stopped.
func (p *Proxy) Stalled() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

// Slow delays every answer of the target by d from now on (each chunk
// read from the target is held d before it is forwarded), on open
// connections and new ones; 0 ends it.
func (p *Proxy) Slow(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slow = d
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slow
}

func (p *Proxy) cutting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().Before(p.cutUntil) {
		p.cuts++
		return true
	}
	return false
}

// Close stops the proxy and closes every connection, stalled ones
// included, so both ends see them end. It is idempotent; New registers it
// with the test's cleanup, and a test calls it earlier to end a stall (a
// client closing a pool waits for the server's answer on each connection).
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	pairs := make([]*pair, 0, len(p.pairs))
	for c := range p.pairs {
		pairs = append(pairs, c)
	}
	p.mu.Unlock()
	for _, c := range pairs {
		c.closeBoth()
	}
}

func (c *pair) closeBoth() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
		close(c.done)
	})
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		c := &pair{client: client, server: server, stall: make(chan struct{}), done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.closeBoth()
			return
		}
		p.pairs[c] = true
		p.mu.Unlock()
		end := func() {
			select {
			case <-c.stall:
				<-c.done // a stalled connection stays open until the proxy closes
			default:
			}
			c.closeBoth()
			p.mu.Lock()
			delete(p.pairs, c)
			p.mu.Unlock()
		}
		go func() { p.forward(c, client, server, false); end() }()
		go func() { p.forward(c, server, client, true); end() }()
	}
}

// forward copies from src to dst until either fails, the connection is
// stalled, or (fromTarget, in a CutAnswers window) the target answers;
// from the target, each chunk waits the Slow delay first.
func (p *Proxy) forward(c *pair, src, dst net.Conn, fromTarget bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-c.stall:
				return
			default:
			}
			if fromTarget && p.cutting() {
				return
			}
			if d := p.delay(); fromTarget && d > 0 {
				select {
				case <-time.After(d):
				case <-c.stall:
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF included: the end closed its side
			return
		}
	}
}
