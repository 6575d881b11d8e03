package idemredis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// Every method refuses invalid parameters with the idemdriver error
// before it sends a command: on a client whose server does not exist the
// error is the typed one, never a connection error, and a valid call on the
// same client fails with the connection error instead.
func TestValidationBeforeAnyCommand(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	s, err := idemredis.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := fp("p")
	long := strings.Repeat("x", idemdriver.DefaultMaxIDLength+1)
	for _, tt := range []struct {
		name string
		call func() error
		want error
	}{
		{"Acquire no consumer", func() error {
			_, err := s.Acquire(ctx, &idemdriver.AcquireParams{MessageID: "m", Fingerprint: f, Lease: time.Second})
			return err
		}, idemdriver.ErrInvalidConsumerName},
		{"Acquire no ID", func() error {
			_, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", Fingerprint: f, Lease: time.Second})
			return err
		}, idemdriver.ErrMissingMessageID},
		{"Acquire long ID", func() error {
			_, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: long, Fingerprint: f, Lease: time.Second})
			return err
		}, idemdriver.ErrInvalidMessageID},
		{"Acquire control byte", func() error {
			_, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "a\x00b", Fingerprint: f, Lease: time.Second})
			return err
		}, idemdriver.ErrInvalidMessageID},
		{"Acquire no fingerprint", func() error {
			_, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Lease: time.Second})
			return err
		}, idemdriver.ErrInvalidPayload},
		{"Acquire zero lease", func() error {
			_, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: f})
			return err
		}, idemdriver.ErrInvalidConfig},
		{"Renew zero lease", func() error {
			return s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: 1})
		}, idemdriver.ErrInvalidConfig},
		{"Renew zero token", func() error {
			return s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Lease: time.Second})
		}, idemdriver.ErrLeaseLost},
		{"Renew bad ID", func() error {
			return s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "\x7f", Token: 1, Lease: time.Second})
		}, idemdriver.ErrInvalidMessageID},
		{"Complete zero token", func() error {
			return s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m"})
		}, idemdriver.ErrLeaseLost},
		{"Complete bad consumer", func() error {
			return s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c\n", MessageID: "m", Token: 1})
		}, idemdriver.ErrInvalidConsumerName},
		{"Release negative token", func() error {
			return s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: -1, Terminal: true})
		}, idemdriver.ErrLeaseLost},
		{"Release no ID", func() error {
			return s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", Token: 1})
		}, idemdriver.ErrMissingMessageID},
		{"SaveStep no step", func() error {
			return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: 1})
		}, idemdriver.ErrInvalidConfig},
		{"SaveStep bad step", func() error {
			return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: 1, Step: "\xff"})
		}, idemdriver.ErrInvalidConfig},
		{"SaveStep zero token", func() error {
			return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Step: "s"})
		}, idemdriver.ErrLeaseLost},
		{"MarkRunning no consumer", func() error {
			return s.MarkRunning(ctx, &idemdriver.MarkRunningParams{})
		}, idemdriver.ErrInvalidConsumerName},
		{"MarkRunning negative gap", func() error {
			return s.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "c", MaxGap: -time.Second})
		}, idemdriver.ErrInvalidConfig},
		{"BeginPurge no consumer", func() error {
			_, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{})
			return err
		}, idemdriver.ErrInvalidConsumerName},
		{"BeginPurge long consumer", func() error {
			_, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: strings.Repeat("c", idemdriver.MaxConsumerNameLength+1)})
			return err
		}, idemdriver.ErrInvalidConsumerName},
	} {
		if err := tt.call(); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want an error matching %v", tt.name, err, tt.want)
		}
	}
	// The same calls with valid parameters reach the (missing) server.
	if err := s.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: "c"}); err == nil || errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("valid MarkRunning on a missing server: %v, want a connection error", err)
	}
	if _, err := s.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"}); err == nil || errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("valid BeginPurge on a missing server: %v, want a connection error", err)
	}
}
