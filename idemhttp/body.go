package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"hash"
	"io"
	"net/http"
	"os"
	"sync"
)

// errBodyTooLarge is returned by spoolBody when the body exceeds the limit.
var errBodyTooLarge = errors.New("request body too large")

// spool is a request body read once, while its SHA-256 is computed, and
// kept for the handler: in memory up to a threshold, in a temporary file
// beyond it, so a large body never sits in the heap. This is how the
// fingerprint, which the claim needs before the handler runs, is computed
// "while streaming": one pass over the body, bounded memory.
type spool struct {
	mem  []byte
	f    *os.File
	h    hash.Hash // the body's running hash once it is in f
	size int64
	sum  [sha256.Size]byte
	// rd reads mem for the handler (reader), allocated with the spool.
	rd memBody
}

// memBody is an in-memory body: a bytes.Reader with a Close that does
// nothing.
type memBody struct{ bytes.Reader }

func (*memBody) Close() error { return nil }

// bufPool holds 32 KiB buffers: the read buffer of a request body that
// does not announce a length that fits in memory, and the Proxy's copy
// buffer of response bodies, so that a request does not allocate (and
// clear) 32 KiB of its own.
var bufPool = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// spoolBody reads body to its end, or fails with errBodyTooLarge past
// maxBytes, or with the read error. sizeHint is the length the request
// announces (its ContentLength; -1 when unknown): a body that announces at
// most memBytes is read straight into a buffer of that size. The caller
// closes the spool.
func spoolBody(body io.Reader, sizeHint, maxBytes, memBytes int64, dir string) (_ *spool, err error) {
	s := &spool{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if body == nil || body == http.NoBody {
		s.sum = sha256.Sum256(nil)
		return s, nil
	}
	if sizeHint >= 0 && sizeHint <= memBytes && sizeHint <= maxBytes {
		// One byte more than announced, so that a body longer than its
		// length (a reader that does not enforce it) is still read on.
		s.mem = make([]byte, 0, sizeHint+1)
	}
	var buf []byte
	for {
		var n int
		var rerr error
		if s.f == nil && len(s.mem) < cap(s.mem) {
			// Read in place while the body fits the announced length.
			n, rerr = body.Read(s.mem[len(s.mem):cap(s.mem)])
			if s.size+int64(n) > maxBytes {
				return nil, errBodyTooLarge
			}
			s.mem = s.mem[:len(s.mem)+n]
			s.size += int64(n)
		} else {
			if buf == nil {
				pb := bufPool.Get().(*[32 << 10]byte)
				defer bufPool.Put(pb)
				buf = pb[:]
			}
			n, rerr = body.Read(buf)
			if n > 0 {
				if s.size+int64(n) > maxBytes {
					return nil, errBodyTooLarge
				}
				if err := s.write(buf[:n], memBytes, dir); err != nil {
					return nil, err
				}
			}
		}
		if done, err := readEnd(rerr); err != nil {
			return nil, err
		} else if done {
			break
		}
	}
	if s.f == nil {
		s.sum = sha256.Sum256(s.mem)
		return s, nil
	}
	s.h.Sum(s.sum[:0])
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return s, nil
}

// readEnd reports whether a body read that returned rerr ended the body,
// or the error that ended it early (errBodyTooLarge for a body that
// outgrew its http.MaxBytesReader).
func readEnd(rerr error) (bool, error) {
	switch {
	case rerr == nil:
		return false, nil
	case rerr == io.EOF:
		return true, nil
	}
	var mbe *http.MaxBytesError
	if errors.As(rerr, &mbe) {
		return true, errBodyTooLarge
	}
	return true, rerr
}

func (s *spool) write(p []byte, memBytes int64, dir string) error {
	s.size += int64(len(p))
	if s.f == nil && s.size <= memBytes {
		s.mem = append(s.mem, p...)
		return nil
	}
	if s.f == nil {
		f, err := os.CreateTemp(dir, "idemhttp-body-*")
		if err != nil {
			return err
		}
		s.f = f
		// Unlinked at once where the OS allows it (the open file stays
		// readable), so a crash leaves nothing behind; close removes it
		// elsewhere.
		_ = os.Remove(f.Name())
		if _, err := f.Write(s.mem); err != nil {
			return err
		}
		// Hashed from here on as it is written: what memory held first.
		s.h = sha256.New()
		s.h.Write(s.mem)
		s.mem = nil
	}
	s.h.Write(p)
	_, err := s.f.Write(p)
	return err
}

// inMemory reports whether the whole body is in memory.
func (s *spool) inMemory() bool { return s.f == nil }

// reader returns the body for the handler.
func (s *spool) reader() io.ReadCloser {
	if s.size == 0 {
		return http.NoBody
	}
	if s.f != nil {
		return io.NopCloser(s.f)
	}
	s.rd.Reset(s.mem)
	return &s.rd
}

// close releases the temporary file, if any.
func (s *spool) close() {
	if s.f != nil {
		name := s.f.Name()
		s.f.Close()
		os.Remove(name)
		s.f = nil
	}
	s.mem = nil
}
