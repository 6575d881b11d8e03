package idemcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
)

// publishFlags are the flags of `idem publish`.
type publishFlags struct {
	broker, to, id, payload, prefix string
	count, concurrency              int
	duplicates                      float64
	seed                            uint64
	natsDuplicates                  time.Duration
}

func newPublishCmd() *cobra.Command {
	var f publishFlags
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Publish test messages with stable IDs (for idem consume)",
		Long: `publish publishes messages with stable message IDs through idem's producers,
to try idem consume out or to test a consumer:

  idem publish --broker nats://127.0.0.1:4222 --to orders.created --id order-42 --payload '{"amount":1000}'
  idem publish --broker kafka://127.0.0.1:9092 --to orders --count 2000 --duplicates 0.2

With --count N the IDs are PREFIX000000 to PREFIX(N-1) (--prefix, default
msg-) and the payload of ID is {"id":"ID","n":N}; --duplicates F publishes
F*N more copies of IDs chosen at random (--seed), each some time after its
first copy. The same flags publish the same messages, so a rerun is a
redelivery. --broker takes the URLs of idem consume; a NATS subject no stream
captures gets a stream (--nats-duplicates is its duplicate window), a
RabbitMQ queue is declared durable. A mem:// topic lives in this process only:
nothing outside it receives what is published there.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPublish(cmd.Context(), cmd.OutOrStdout(), &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.broker, "broker", "", "broker URL: nats://..., kafka://..., amqp://..., redis://..., or a Go CDK URL: gcppubsub://..., awssqs://..., mem://... (in this process only) (required)")
	fl.StringVar(&f.to, "to", "", "NATS subject, Kafka topic, RabbitMQ queue or Redis stream (required)")
	fl.StringVar(&f.id, "id", "", "publish one message with this ID")
	fl.StringVar(&f.payload, "payload", "", `payload of the --id message (default {"id":"ID"})`)
	fl.IntVar(&f.count, "count", 0, "publish this many messages with generated IDs")
	fl.StringVar(&f.prefix, "prefix", "msg-", "ID prefix of the --count messages")
	fl.Float64Var(&f.duplicates, "duplicates", 0, "extra copies, as a fraction of --count (0.2: 20% more)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the choice of duplicates")
	fl.IntVar(&f.concurrency, "concurrency", 1, "messages published at a time (above 1, a duplicate may go out beside its first copy)")
	fl.DurationVar(&f.natsDuplicates, "nats-duplicates", 2*time.Minute, "JetStream's duplicate window of a stream this command creates")
	return cmd
}

// publishPlan returns the IDs to publish, in order: with --id that one,
// with --count the generated IDs with the duplicates spread after their
// first copies.
func (f *publishFlags) plan() ([]string, error) {
	switch {
	case f.broker == "" || f.to == "":
		return nil, usageError{errors.New("--broker and --to are required (or IDEM_BROKER, IDEM_TO)")}
	case (f.id == "") == (f.count == 0):
		return nil, usageError{errors.New("give either --id or --count")}
	case f.count < 0:
		return nil, usageError{errors.New("--count must be positive")}
	case f.concurrency < 1:
		return nil, usageError{errors.New("--concurrency must be at least 1")}
	case f.duplicates < 0 || f.duplicates > 100 || math.IsNaN(f.duplicates):
		return nil, usageError{errors.New("--duplicates must be between 0 and 100")}
	case f.id != "" && f.duplicates != 0:
		return nil, usageError{errors.New("--duplicates goes with --count")}
	}
	if f.id != "" {
		return []string{f.id}, nil
	}
	type slot struct {
		at float64
		id string
	}
	r := rand.New(rand.NewPCG(f.seed, 0))
	slots := make([]slot, 0, f.count)
	for i := range f.count {
		slots = append(slots, slot{float64(i), fmt.Sprintf("%s%06d", f.prefix, i)})
	}
	for range int(math.Round(f.duplicates * float64(f.count))) {
		i := r.IntN(f.count)
		slots = append(slots, slot{float64(i) + 0.5 + r.Float64()*float64(f.count-i), slots[i].id})
	}
	slices.SortStableFunc(slots, func(a, b slot) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = s.id
	}
	return ids, nil
}

// payloadOf returns the payload of id: the same on every copy.
func (f *publishFlags) payloadOf(id string, n int) []byte {
	if f.id != "" {
		if f.payload != "" {
			return []byte(f.payload)
		}
		return fmt.Appendf(nil, `{"id":%q}`, id)
	}
	return fmt.Appendf(nil, `{"id":%q,"n":%d}`, id, n)
}

func runPublish(ctx context.Context, stdout io.Writer, f *publishFlags) error {
	ids, err := f.plan()
	if err != nil {
		return err
	}
	b, err := openSidecarBroker(ctx, f.broker, f.natsDuplicates)
	if err != nil {
		return err
	}
	defer b.close()
	start := time.Now()
	first := map[string]int{}
	type job struct {
		id string
		n  int
	}
	jobs := make([]job, len(ids))
	for i, id := range ids {
		n, seen := first[id]
		if !seen {
			n = len(first)
			first[id] = n
		}
		jobs[i] = job{id, n}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.concurrency)
	for i, j := range jobs {
		g.Go(func() error {
			if err := b.publish(gctx, f.to, j.id, f.payloadOf(j.id, j.n)); err != nil {
				return fmt.Errorf("publish %s (%d of %d): %w", j.id, i+1, len(ids), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "idem publish: %d messages to %s on %s (%d IDs, %d duplicates) in %v\n",
		len(ids), f.to, b.where(), len(first), len(ids)-len(first), time.Since(start).Round(time.Millisecond))
	return nil
}
