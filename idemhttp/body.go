package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"os"
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
	size int64
	sum  []byte
}

// spoolBody reads body to its end, or fails with errBodyTooLarge past
// maxBytes, or with the read error. The caller closes the spool.
func spoolBody(body io.Reader, maxBytes, memBytes int64, dir string) (_ *spool, err error) {
	s := &spool{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	h := sha256.New()
	if body == nil || body == http.NoBody {
		s.sum = h.Sum(nil)
		return s, nil
	}
	buf := make([]byte, 32<<10)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if s.size+int64(n) > maxBytes {
				return nil, errBodyTooLarge
			}
			h.Write(buf[:n])
			if err := s.write(buf[:n], memBytes, dir); err != nil {
				return nil, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			var mbe *http.MaxBytesError
			if errors.As(rerr, &mbe) {
				return nil, errBodyTooLarge
			}
			return nil, rerr
		}
	}
	s.sum = h.Sum(nil)
	if s.f != nil {
		if _, err := s.f.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return s, nil
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
		s.mem = nil
	}
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
	return io.NopCloser(bytes.NewReader(s.mem))
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
