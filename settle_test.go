package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Settle makes the one decision every broker adapter carries out: the
// action, the redelivery delay and the reason, for every Status and the
// errors that change it.
func TestSettle(t *testing.T) {
	const retry = 700 * time.Millisecond
	boom := errors.New("boom")
	tests := []struct {
		name   string
		out    idem.Outcome
		action idem.Action
		delay  time.Duration
		reason string
		level  slog.Level
	}{
		{"processed", idem.Outcome{Status: idem.Processed}, idem.Ack, 0, idem.ReasonProcessed, slog.LevelDebug},
		{"duplicate", idem.Outcome{Status: idem.Duplicate}, idem.Ack, 0, idem.ReasonDuplicate, slog.LevelDebug},
		{"processed with an error is not acked", idem.Outcome{Status: idem.Processed, Err: boom}, idem.Redeliver, retry, idem.ReasonFailed, slog.LevelWarn},
		{"in progress after RetryAfter", idem.Outcome{Status: idem.InProgress, RetryAfter: 3 * time.Second, Err: idem.ErrInProgress}, idem.Redeliver, 3 * time.Second, idem.ReasonInProgress, slog.LevelDebug},
		{"in progress without RetryAfter", idem.Outcome{Status: idem.InProgress, Err: idem.ErrInProgress}, idem.Redeliver, retry, idem.ReasonInProgress, slog.LevelDebug},
		{"failed", idem.Outcome{Status: idem.Failed, Err: boom}, idem.Redeliver, retry, idem.ReasonFailed, slog.LevelWarn},
		{"store failure", idem.Outcome{Status: idem.Failed, Err: fmt.Errorf("%w: db closed", idem.ErrStore)}, idem.Redeliver, retry, idem.ReasonFailed, slog.LevelError},
		{"panic", idem.Outcome{Status: idem.Failed, Err: &idem.PanicError{Value: "x"}}, idem.Redeliver, retry, idem.ReasonFailed, slog.LevelError},
		{"invalid status", idem.Outcome{}, idem.Redeliver, retry, idem.ReasonFailed, slog.LevelWarn},
		{"missing ID", idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.DeadLetter, 0, idem.ReasonMissingMessageID, slog.LevelWarn},
		{"invalid ID", idem.Outcome{Status: idem.Rejected, Err: fmt.Errorf("%w: too long", idem.ErrInvalidMessageID)}, idem.DeadLetter, 0, idem.ReasonInvalidMessageID, slog.LevelWarn},
		{"invalid payload", idem.Outcome{Status: idem.Rejected, Err: idem.ErrInvalidPayload}, idem.DeadLetter, 0, idem.ReasonInvalidPayload, slog.LevelWarn},
		{"rejected otherwise", idem.Outcome{Status: idem.Rejected, Err: boom}, idem.DeadLetter, 0, idem.ReasonRejected, slog.LevelWarn},
		{"mismatch", idem.Outcome{Status: idem.FingerprintMismatch, Err: idem.ErrFingerprintMismatch}, idem.DeadLetter, 0, idem.ReasonFingerprintMismatch, slog.LevelWarn},
		{"permanent without Poison", idem.Outcome{Status: idem.Failed, Err: idem.Permanent(boom)}, idem.DeadLetter, 0, idem.ReasonPermanent, slog.LevelWarn},
		{"permanent in lease mode", idem.Outcome{Status: idem.Failed, Poison: true, Err: fmt.Errorf("%w: %w", idem.ErrPoison, idem.Permanent(boom))}, idem.DeadLetter, 0, idem.ReasonPermanent, slog.LevelWarn},
		{"max attempts", idem.Outcome{Status: idem.Failed, Poison: true, Err: fmt.Errorf("%w: 5 attempts", idem.ErrPoison)}, idem.DeadLetter, 0, idem.ReasonPoison, slog.LevelWarn},
		{"delivery limit", idem.Outcome{Status: idem.Failed, Poison: true, Err: fmt.Errorf("%w: 10", idem.ErrTooManyDeliveries)}, idem.DeadLetter, 0, idem.ReasonTooManyDeliveries, slog.LevelWarn},
		{"outcome unknown", idem.Outcome{Status: idem.Failed, Poison: true, Err: idem.Permanent(fmt.Errorf("%w: sent, no answer", idem.ErrOutcomeUnknown))}, idem.DeadLetter, 0, idem.ReasonOutcomeUnknown, slog.LevelWarn},
		{"failed asking for a longer wait", idem.Outcome{Status: idem.Failed, RetryAfter: 5 * time.Second, Err: boom}, idem.Redeliver, 5 * time.Second, idem.ReasonFailed, slog.LevelWarn},
		{"failed asking for a shorter wait", idem.Outcome{Status: idem.Failed, RetryAfter: time.Millisecond, Err: boom}, idem.Redeliver, retry, idem.ReasonFailed, slog.LevelWarn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.out.MessageID = "m-1"
			s := tt.out.Settle(retry)
			if s.Action != tt.action || s.Delay != tt.delay || s.Reason != tt.reason {
				t.Errorf("Settle = %v after %v, %q; want %v after %v, %q", s.Action, s.Delay, s.Reason, tt.action, tt.delay, tt.reason)
			}
			if s.Level() != tt.level {
				t.Errorf("Level = %v, want %v", s.Level(), tt.level)
			}
			if s.Status != tt.out.Status || s.MessageID != "m-1" {
				t.Errorf("Settlement status %v, ID %q; want the Outcome's %v, m-1", s.Status, s.MessageID, tt.out.Status)
			}
			if (s.Err == nil) != (s.Action == idem.Ack) {
				t.Errorf("Err %v for %v: want nil exactly for Ack", s.Err, s.Action)
			}
			if tt.out.Err != nil && s.Err != tt.out.Err {
				t.Errorf("Err %v, want the Outcome's own %v", s.Err, tt.out.Err)
			}
		})
	}
}

// A dead letter's headers: the reason word, the error text, the status and
// the original ID, under the names every adapter uses.
func TestSettlementDeadLetterHeaders(t *testing.T) {
	err := fmt.Errorf("%w: holds a control character", idem.ErrInvalidMessageID)
	h := idem.Outcome{Status: idem.Rejected, MessageID: "a\x01b", Err: err}.Settle(time.Second).DeadLetterHeaders()
	want := map[string]string{
		"Idem-Dead-Letter-Reason":  "invalid-message-id",
		"Idem-Dead-Letter-Error":   err.Error(),
		"Idem-Dead-Letter-Status":  "Rejected",
		"Idem-Original-Message-Id": "a\x01b",
	}
	if len(h) != len(want) {
		t.Errorf("headers %q, want %q", h, want)
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("header %s = %q, want %q", k, h[k], v)
		}
	}
	// No ID: no original-ID header, and an error even when the Outcome had none.
	h = idem.Outcome{Status: idem.Rejected}.Settle(time.Second).DeadLetterHeaders()
	if _, ok := h[idem.HeaderOriginalMessageID]; ok {
		t.Errorf("ID-less dead letter has %s", idem.HeaderOriginalMessageID)
	}
	if h[idem.HeaderDeadLetterError] == "" || h[idem.HeaderDeadLetterReason] != idem.ReasonRejected {
		t.Errorf("ID-less dead letter headers %q", h)
	}
}

// Log writes one record at the Settlement's level, with the same message
// and attributes whatever the adapter.
func TestSettlementLog(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx := context.Background()
	idem.Outcome{Status: idem.Duplicate, MessageID: "d"}.Settle(time.Second).Log(ctx, l, "idemx")
	if buf.Len() != 0 {
		t.Fatalf("a duplicate was logged above debug: %s", buf.String())
	}
	idem.Outcome{Status: idem.Rejected, MessageID: "r", Err: idem.ErrInvalidMessageID}.Settle(time.Second).Log(ctx, l, "idemx", "queue", "q1")
	got := buf.String()
	for _, want := range []string{"level=WARN", `msg="idemx: message dead-lettered"`, "message_id=r", "status=Rejected", "reason=invalid-message-id", "queue=q1", `err="idem: invalid message ID"`} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	buf.Reset()
	idem.Outcome{Status: idem.Failed, MessageID: "f", Err: idem.ErrStore}.Settle(2*time.Second).Log(ctx, l, "idemx")
	if got := buf.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "delay=2s") {
		t.Errorf("store failure logged as %q, want an error with the delay", got)
	}
}

// GuardBatch gives one normalised Outcome per message whatever the
// BatchProcessor does: panic, return too few outcomes, or outcomes that
// need Guard's rules.
func TestGuardBatch(t *testing.T) {
	ctx := context.Background()
	msgs := []idem.Message{{ID: "a"}, {ID: "b"}}
	type bf = func(context.Context, []idem.Message) ([]idem.Outcome, error)
	tests := []struct {
		name  string
		p     bf
		check func(t *testing.T, outs []idem.Outcome)
	}{
		{"panic", func(context.Context, []idem.Message) ([]idem.Outcome, error) { panic("bug") }, func(t *testing.T, outs []idem.Outcome) {
			for _, o := range outs {
				if o.Status != idem.Failed || !errors.Is(o.Err, idem.ErrHandlerPanic) || o.Settle(time.Second).Action != idem.Redeliver {
					t.Errorf("outcome %+v, want Failed with ErrHandlerPanic, redelivered", o)
				}
			}
		}},
		{"too few", func(context.Context, []idem.Message) ([]idem.Outcome, error) {
			return []idem.Outcome{{Status: idem.Processed}}, nil
		}, func(t *testing.T, outs []idem.Outcome) {
			for i, o := range outs {
				if o.Status != idem.Failed || o.MessageID != msgs[i].ID || o.Err == nil {
					t.Errorf("outcome %d %+v, want Failed with an error", i, o)
				}
			}
		}},
		{"normalised", func(context.Context, []idem.Message) ([]idem.Outcome, error) {
			return []idem.Outcome{{Status: idem.Failed, Err: idem.Permanent(errors.New("no"))}, {Status: idem.Processed, MessageID: "b"}}, nil
		}, func(t *testing.T, outs []idem.Outcome) {
			if !outs[0].Poison || outs[0].MessageID != "a" || outs[0].Settle(time.Second).Reason != idem.ReasonPermanent {
				t.Errorf("permanent outcome %+v, want Poison with ID a, reason permanent", outs[0])
			}
			if outs[1].Settle(time.Second).Action != idem.Ack {
				t.Errorf("processed outcome %+v not acked", outs[1])
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outs := idem.GuardBatch(ctx, batchFunc(tt.p), msgs)
			if len(outs) != len(msgs) {
				t.Fatalf("%d outcomes for %d messages", len(outs), len(msgs))
			}
			tt.check(t, outs)
		})
	}
}

type batchFunc func(context.Context, []idem.Message) ([]idem.Outcome, error)

func (f batchFunc) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	return f(ctx, msgs)
}
