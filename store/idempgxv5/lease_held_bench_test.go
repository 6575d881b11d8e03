package idempgxv5_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// BenchmarkHeldAttempts holds 10,000 lease-mode attempts at once on
// PostgreSQL (lease 30s, so renewed every 10s) for 12s after the last
// Acquire and reports the client process's goroutines, its live heap per
// attempt, the renewals and their store round trips per lease
// (idemtest.BenchmarkHeldAttempts), with the CPU (client and server) and
// WAL of the whole run per attempt (Acquire, renewals, Complete: the
// .../msg metrics count attempts):
//
//	go test -run '^$' -bench BenchmarkHeldAttempts -benchtime 1x
func BenchmarkHeldAttempts(b *testing.B) {
	const n = 10000
	bb := setup(b, poolOpts{})
	m, w := startCPU(b, bb.pool), startWAL(b, bb)
	idemtest.BenchmarkHeldAttempts(b, bb.store, "bench-held", n, 30*time.Second, 12*time.Second)
	m.report(b, n)
	w.report(b, n)
}

// BenchmarkRenewWAL renews 1,000 held leases, one Renew each and then in
// RenewBatch calls of 500, b.N times each, and reports the WAL bytes per
// renewal of each way (pg_current_wal_insert_lsn) and the share of their
// updates PostgreSQL made HOT (heap-only: no index entry written). A
// batch updates every row of the pages it touches in one transaction,
// and those pages (filled by the acquisitions, fill factor 100) have no
// room for the new versions, so few of its updates are HOT:
//
//	go test -run '^$' -bench BenchmarkRenewWAL -benchtime 3x
func BenchmarkRenewWAL(b *testing.B) {
	const n, size = 1000, 500
	bb := setup(b, poolOpts{})
	ctx := b.Context()
	fp, _ := idem.SHA256Fingerprint([]byte("p"))
	ps := make([]idemdriver.RenewParams, n)
	for i := range ps {
		id := "m-" + strconv.Itoa(i)
		res, err := bb.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "wal", MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || !res.Acquired {
			b.Fatalf("Acquire %s: %+v %v", id, res, err)
		}
		ps[i] = idemdriver.RenewParams{Consumer: "wal", MessageID: id, Token: res.Token, Lease: time.Minute}
	}
	read := func() (lsn, upd, hot int64) {
		if _, err := bb.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			b.Fatal(err)
		}
		if err := bb.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, n_tup_upd, n_tup_hot_upd
			FROM pg_stat_user_tables WHERE relid = $1::regclass`, bb.table).Scan(&lsn, &upd, &hot); err != nil {
			b.Fatal(err)
		}
		return lsn, upd, hot
	}
	var wal, upd, hot [2]int64
	for b.Loop() {
		for way := range 2 {
			l0, u0, h0 := read()
			if way == 0 {
				for i := range ps {
					if err := bb.store.Renew(ctx, &ps[i]); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				for i := 0; i < n; i += size {
					if errs, err := bb.store.RenewBatch(ctx, ps[i:i+size]); err != nil || errs[0] != nil {
						b.Fatal(err, errs)
					}
				}
			}
			l1, u1, h1 := read()
			wal[way] += l1 - l0
			upd[way] += u1 - u0
			hot[way] += h1 - h0
		}
	}
	for way, name := range []string{"single", "batch"} {
		b.ReportMetric(float64(wal[way])/float64(b.N*n), name+"-wal-B/renewal")
		b.ReportMetric(float64(hot[way])/float64(max(upd[way], 1)), name+"-hot-share")
	}
}
