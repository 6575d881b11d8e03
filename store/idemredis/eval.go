package idemredis

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// evalScript is a script of the lease-mode hot path (one call per
// message), run by Store.eval: its hash and source are boxed once, as
// EVALSHA and EVAL arguments.
type evalScript struct {
	sha, src any
}

func newEvalScript(s *redis.Script, src string) *evalScript {
	return &evalScript{sha: s.Hash(), src: src}
}

// eval runs sc as redis.Script.Run does (EVALSHA, then EVAL when the
// server does not have the script), building the command's arguments in
// one slice: keysAndArgs holds nkeys keys, then the script's arguments.
// Script.Run copies its keys and arguments into a new slice of its own
// and boxes the hash again on every call, which cost a message three
// allocations of each of its two scripts.
//
// The command's argument slice comes from a pool and goes back to it,
// cleared, once the reply was read: go-redis keeps no reference to a
// command's arguments after Process returns.
func (s *Store) eval(ctx context.Context, sc *evalScript, nkeys int, keysAndArgs ...any) (any, error) {
	ap := evalArgs.Get().(*[]any)
	args := append((*ap)[:0], "evalsha", sc.sha, nkeys)
	args = append(args, keysAndArgs...)
	cmd := s.evalCmd(ctx, nkeys, args)
	// HasErrorPrefix allocates even for a nil error: ask only on an error.
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", sc.src
		cmd = s.evalCmd(ctx, nkeys, args)
	}
	v, err := cmd.Result()
	clear(args)
	*ap = args[:0]
	evalArgs.Put(ap)
	return v, err
}

// evalArgs is eval's pool of argument slices.
var evalArgs = sync.Pool{New: func() any { s := make([]any, 0, 10); return &s }}

// evalCmd sends the EVALSHA or EVAL command args, whose keys (nkeys of
// them) start at its fourth word, as redis.Client.Eval sends it, so that
// a Cluster client routes it by its first key; with Config.WaitReplicas,
// followed by WAIT in the same pipeline (ErrNotReplicated when short).
func (s *Store) evalCmd(ctx context.Context, nkeys int, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	if s.wait == 0 {
		_ = s.client.Process(ctx, cmd)
		return cmd
	}
	// Config.WaitReplicas: WAIT in the same round trip, as Store.run sends it.
	var key string
	if nkeys > 0 {
		switch k := args[3].(type) {
		case string:
			key = k
		case *evalArg:
			key = k.String()
		}
	}
	c, err := s.waitClient(ctx, key)
	if err != nil {
		cmd.SetErr(err)
		return cmd
	}
	pl := c.Pipeline()
	_ = pl.Process(ctx, cmd)
	w := pl.Do(ctx, "WAIT", s.wait, s.waitMS)
	_, _ = pl.Exec(ctx)
	if err := cmd.Err(); err != nil {
		s.reroute(ctx, err)
	} else if err := s.waited(w); err != nil {
		cmd.SetErr(err)
	}
	return cmd
}

// evalArg is a key or an argument of a hot-path script call held in an
// evalFrame: go-redis writes its bytes as they are (MarshalBinary, without
// a copy), routes a Cluster command by them and shows them in a command's
// text (String). Passed as a pointer, it is boxed without an allocation,
// where a string or a byte slice costs one each.
type evalArg struct {
	b        []byte
	borrowed bool // b is a caller's (evalFrame.bytes), not the frame's buffer
	// own is the frame's buffer of this argument, kept from call to call
	// while a call borrows b: Acquire and Complete take the same frames
	// and borrow different arguments of them (the fingerprint, the
	// result), so a buffer dropped by one call would be made again by
	// the next call of the other.
	own []byte
}

// MarshalBinary returns the argument's bytes, not a copy: go-redis only
// writes them to the connection.
func (a *evalArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// String returns the argument as text (go-redis's command text and its
// Cluster routing by a key that is not a string).
func (a *evalArg) String() string { return string(a.b) }

// evalFrame holds the keys and arguments of one call of Acquire or
// Complete (evalArg), so that building and boxing them allocates nothing
// once the pool is warm: keys and strings are written into buffers the
// frame keeps from call to call, and a caller's byte slices are referred
// to, not copied. Taken with getFrame, given back by release once the
// reply was read.
type evalFrame struct {
	args [4]evalArg
	n    int // args in use
}

var evalFrames = sync.Pool{New: func() any { return new(evalFrame) }}

// maxFrameBuf is the largest buffer an evalFrame keeps for its next
// call: a key of a long ID or a long content type is not held on to.
const maxFrameBuf = 1 << 10

func getFrame() *evalFrame { return evalFrames.Get().(*evalFrame) }

// buf returns the frame's next argument, empty, to append to (its buffer
// is kept from earlier calls).
func (f *evalFrame) buf() *evalArg {
	a := &f.args[f.n]
	f.n++
	a.b, a.borrowed = a.own[:0], false
	return a
}

// str returns the frame's next argument holding a copy of s.
func (f *evalFrame) str(s string) *evalArg {
	a := f.buf()
	a.b = append(a.b, s...)
	return a
}

// bytes returns the frame's next argument holding b itself.
func (f *evalFrame) bytes(b []byte) *evalArg {
	a := &f.args[f.n]
	f.n++
	a.b, a.borrowed = b, true
	return a
}

// release readies the frame for its next call (reset) and puts it back
// in the pool.
func (f *evalFrame) release() {
	f.reset()
	evalFrames.Put(f)
}

// reset drops the frame's references to its callers' byte slices and
// keeps its own buffers (those of up to maxFrameBuf bytes, also of the
// arguments this call borrowed).
func (f *evalFrame) reset() {
	for i := range f.n {
		a := &f.args[i]
		if !a.borrowed {
			a.own = a.b // grown by the call's appends, perhaps
		}
		if cap(a.own) > maxFrameBuf {
			a.own = nil
		}
		a.b, a.borrowed = nil, false
	}
	f.n = 0
}
