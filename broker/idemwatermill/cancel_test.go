package idemwatermill_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
)

// A delivery whose context ends before its claim (the Router closing) is
// nacked, the handler never runs, and the log says so at debug: it is not
// a store error.
func TestCancelledDeliveryNackedNotLoggedAsError(t *testing.T) {
	c, _ := newConsumer(t)
	var log bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mw, err := idemwatermill.Transactional(c, idemwatermill.Config{Logger: logger})
	calls := 0
	h := wrap(t, mw, err, func(*message.Message) ([]*message.Message, error) {
		calls++
		return nil, nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	msg := message.NewMessage("pay-1", []byte("100"))
	msg.SetContext(ctx)
	out, err := h(msg)
	var e *idemwatermill.Error
	if !errors.As(err, &e) || e.Settlement.Action != idem.Redeliver || idemwatermill.ShouldDeadLetter(err) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled delivery: %v, %v; want a redeliver error (nack) matching context.Canceled", out, err)
	}
	if calls != 0 {
		t.Errorf("the handler ran %d times", calls)
	}
	if strings.Contains(log.String(), `"level":"ERROR"`) || strings.Contains(log.String(), `"level":"WARN"`) {
		t.Errorf("a cancelled delivery logged above debug: %s", log.String())
	}
	if !strings.Contains(log.String(), `"level":"DEBUG"`) || !strings.Contains(log.String(), `"message_id":"pay-1"`) {
		t.Errorf("no debug entry for the cancelled delivery: %s", log.String())
	}
	// Nothing was claimed: the next delivery runs the handler.
	if _, err := h(message.NewMessage("pay-1", []byte("100"))); err != nil || calls != 1 {
		t.Errorf("next delivery: %v, handler ran %d times; want nil and 1", err, calls)
	}
}
