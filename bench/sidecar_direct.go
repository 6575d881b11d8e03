package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemsql"
)

// directConsumer is the contender a Go service would write with idem
// itself instead of running the sidecar: idemnats.Consumer with
// concurrency handlers over an idem.LeaseConsumer (idem.BindLease) on
// store ("sqlite" in dir, or a PostgreSQL URL through pgx), each handler
// POSTing the message to the service as the sidecar does (the message ID
// as Idempotency-Key) and failing on an answer that is not a 2xx. The
// store is called one message at a time (the sidecar's store batches
// come from an internal package), and it runs in this process, as the
// bare relay does, so its CPU is not measured apart.
func directConsumer(js jetstream.JetStream, dir, store string, concurrency int) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
		ls, closeStore, err := openDirectStore(ctx, dir, store, tag)
		if err != nil {
			return nil, err
		}
		lc, err := idem.NewLeaseConsumer(ls, idem.Config{Name: tag, Lease: 3 * time.Second})
		if err != nil {
			closeStore()
			return nil, err
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
		handler := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(a.Message.Payload)))
			if err != nil {
				return idem.Result{}, err
			}
			req.Header.Set("Idempotency-Key", a.Message.ID)
			resp, err := client.Do(req)
			if err != nil {
				return idem.Result{}, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				return idem.Result{}, fmt.Errorf("the service answered %d", resp.StatusCode)
			}
			return idem.Result{}, nil
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "direct", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second})
		if err != nil {
			lc.Close()
			closeStore()
			return nil, err
		}
		c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: idem.BindLease(lc, handler),
			DeadLetter: subject + ".dead", Concurrency: concurrency})
		if err != nil {
			lc.Close()
			closeStore()
			return nil, err
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(context.WithoutCancel(ctx)) }()
		return func() usage {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = c.Stop(sctx)
			<-done
			lc.Close()
			client.CloseIdleConnections()
			closeStore()
			return usage{}
		}, nil
	}
}

// openDirectStore opens and migrates the direct consumer's lease store:
// a SQLite file of its own in dir, or table tag on PostgreSQL.
func openDirectStore(ctx context.Context, dir, store, tag string) (idemdriver.LeaseStore, func(), error) {
	if store == "sqlite" {
		path := filepath.Join(dir, tag+".db")
		db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path))
		if err != nil {
			return nil, nil, err
		}
		s, err := idemsql.New(db, idemsql.SQLite, nil)
		if err == nil {
			err = s.Migrate(ctx)
		}
		if err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("sqlite: %w", err)
		}
		return s, func() {
			db.Close()
			for _, suffix := range []string{"", "-wal", "-shm"} {
				_ = os.Remove(path + suffix)
			}
		}, nil
	}
	pool, err := pgxpool.New(ctx, store)
	if err != nil {
		return nil, nil, err
	}
	s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: tag})
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	return s, pool.Close, nil
}
