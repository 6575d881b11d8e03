//go:build !nogocdk

package idemcli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"gocloud.dev/pubsub"
	_ "gocloud.dev/pubsub/awssnssqs" // awssqs:// URLs
	_ "gocloud.dev/pubsub/gcppubsub" // gcppubsub:// URLs
	_ "gocloud.dev/pubsub/mempubsub" // mem:// URLs

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemgocdk"
)

// Go CDK pub/sub (gocloud.dev/pubsub), through idemgocdk. The --broker URL
// is the start of a Go CDK URL and --from, --to and --dead-letter its
// end: the subscription `idem consume` reads is --broker followed by
// --from, the topic `idem publish` sends to --broker followed by --to.
//
//	gcppubsub://   --from projects/P/subscriptions/S   --to projects/P/topics/T
//	awssqs://      --from sqs.REGION.amazonaws.com/ACCOUNT/QUEUE?region=REGION (the same for --to)
//	mem://         --from T --to T (in this process only: tests and examples)
//
// Credentials come from the environment as the Go CDK's drivers read them
// (Application Default Credentials, PUBSUB_EMULATOR_HOST; the AWS SDK's
// chain), never from the URL. `go build -tags nogocdk` leaves the Go CDK
// and its drivers out of the binary (broker_gocdk_off.go).

// goCDKSchemes are the URL schemes `idem consume` and `idem publish` hand
// to the Go CDK.
var goCDKSchemes = map[string]string{
	"gcppubsub": "gcp_pubsub",
	"awssqs":    "aws_sqs",
	"mem":       "gocdk_mem",
}

// isGoCDKURL reports whether rawURL names a Go CDK driver.
func isGoCDKURL(rawURL string) bool {
	scheme, _, _ := strings.Cut(rawURL, ":")
	_, ok := goCDKSchemes[strings.ToLower(scheme)]
	return ok
}

// openGoCDK returns the sidecar broker of a Go CDK URL prefix. It does no
// I/O: topics and subscriptions are opened when first used.
func openGoCDK(rawURL string) (sidecarBroker, error) {
	scheme, rest, _ := strings.Cut(rawURL, ":")
	scheme = strings.ToLower(scheme)
	if _, ok := goCDKSchemes[scheme]; !ok || (rest != "//" && !strings.HasPrefix(rest, "//")) {
		return nil, usageError{fmt.Errorf("%w: broker %q: want gcppubsub://, awssqs:// or mem://", errBadURL, redact(rawURL))}
	}
	return &goCDKSidecar{base: scheme + ":" + rest, scheme: scheme, prod: idemgocdk.NewProducer(idemgocdk.ProducerConfig{}),
		topics: map[string]*pubsub.Topic{}}, nil
}

type goCDKSidecar struct {
	base, scheme string
	prod         *idemgocdk.Producer

	mu     sync.Mutex
	topics map[string]*pubsub.Topic // by URL
	subs   []*pubsub.Subscription
}

// url joins the --broker prefix and a resource name.
func (b *goCDKSidecar) url(name string) string {
	if strings.HasSuffix(b.base, "/") || strings.HasPrefix(name, "/") {
		return b.base + name
	}
	if b.base == b.scheme+"://" {
		return b.base + name
	}
	return b.base + "/" + name
}

// topic opens (once) the topic of name.
func (b *goCDKSidecar) topic(ctx context.Context, name string) (*pubsub.Topic, error) {
	u := b.url(name)
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.topics[u]; t != nil {
		return t, nil
	}
	t, err := pubsub.OpenTopic(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("open topic %s: %w", redact(u), err)
	}
	b.topics[u] = t
	return t, nil
}

// deadLetterTopic is the topic of the dead letter dl of src. The default
// dead letter (src with -dead) takes -dead before a query (awssqs's
// ?region=), and on Pub/Sub names a subscription where the topic of that
// name is meant.
func (b *goCDKSidecar) deadLetterTopic(src, dl string) string {
	if path, query, ok := strings.Cut(src, "?"); ok && dl == src+"-dead" {
		dl = path + "-dead?" + query
	}
	if b.scheme == "gcppubsub" {
		if rest, ok := strings.CutPrefix(dl, "subscriptions/"); ok {
			dl = "topics/" + rest
		}
		dl = strings.Replace(dl, "/subscriptions/", "/topics/", 1)
	}
	return dl
}

func (b *goCDKSidecar) consume(ctx context.Context, src string, p idem.Processor, o consumeConfig) (run, stop func(ctx context.Context) error, err error) {
	if b.scheme == "mem" {
		// A mempubsub subscription needs its topic first.
		if _, err := b.topic(ctx, src); err != nil {
			return nil, nil, err
		}
	}
	dead, err := b.topic(ctx, b.deadLetterTopic(src, o.deadLetter))
	if err != nil {
		return nil, nil, err
	}
	u := b.url(src)
	sub, err := pubsub.OpenSubscription(ctx, u)
	if err != nil {
		return nil, nil, fmt.Errorf("open subscription %s: %w", redact(u), err)
	}
	c, err := idemgocdk.NewConsumer(sub, idemgocdk.Config{Processor: p, DeadLetter: dead, Concurrency: o.concurrency,
		RetryDelay: o.retryDelay, Destination: src, System: goCDKSchemes[b.scheme], Logger: o.logger})
	if err != nil {
		_ = sub.Shutdown(ctx)
		return nil, nil, usageError{err}
	}
	b.mu.Lock()
	b.subs = append(b.subs, sub)
	b.mu.Unlock()
	return c.Run, func(ctx context.Context) error {
		// Stop, then Shutdown: it sends the acks the Go CDK still holds.
		return errors.Join(c.Stop(ctx), sub.Shutdown(ctx))
	}, nil
}

func (b *goCDKSidecar) publish(ctx context.Context, dst, id string, payload []byte) error {
	t, err := b.topic(ctx, dst)
	if err != nil {
		return err
	}
	_, err = b.prod.Send(ctx, t, &pubsub.Message{Body: payload}, id)
	return err
}

// healthy is true: the Go CDK keeps no connection of its own to check; a
// subscription that fails for good ends the consumer's Run.
func (b *goCDKSidecar) healthy(context.Context) bool { return true }

func (b *goCDKSidecar) where() string { return redact(b.base) }

func (b *goCDKSidecar) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	ctx := context.Background()
	for _, s := range b.subs {
		_ = s.Shutdown(ctx)
	}
	if b.scheme == "mem" {
		// mempubsub's URL opener hands every opener of a name the same
		// topic, for the life of the process: shutting it down here would
		// break the others.
		return
	}
	for _, t := range b.topics {
		_ = t.Shutdown(ctx)
	}
}
