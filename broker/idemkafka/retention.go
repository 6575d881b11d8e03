package idemkafka

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// topicRetention is a topic's retention.ms: how long Kafka keeps a record,
// hence how far back a group reset or a new group can replay. forever is
// true for retention.ms -1.
type topicRetention struct {
	topic   string
	keep    time.Duration
	forever bool
}

// checkRetention warns, once at the start of Run, for each consumed topic
// that keeps records longer than Config.RetentionWindow: a record replayed after idem purged its ID would be
// processed again. It does nothing when RetentionWindow is zero; a failure
// to read the topics' configuration is logged at debug level only.
func (c *Consumer) checkRetention(ctx context.Context) {
	if c.cfg.RetentionWindow <= 0 {
		return
	}
	topics, _ := c.cl.OptValue(kgo.ConsumeTopics).([]string)
	if len(topics) == 0 {
		return
	}
	if regex, _ := c.cl.OptValue(kgo.ConsumeRegex).(bool); regex {
		return // topic names are patterns; nothing to describe
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	rets, err := describeRetention(ctx, c.cl, topics)
	if err != nil {
		c.log.Debug("idemkafka: cannot read the topics' retention.ms", "topics", topics, "err", err)
		return
	}
	for _, r := range rets {
		switch {
		case r.forever:
			c.log.Warn("idemkafka: topic keeps records forever (retention.ms -1), longer than the retention window of processed IDs: a replay of records older than the window processes them again",
				"topic", r.topic, "retention_window", c.cfg.RetentionWindow)
		case r.keep > c.cfg.RetentionWindow:
			c.log.Warn("idemkafka: topic keeps records longer than the retention window of processed IDs: a replay of records older than the window processes them again",
				"topic", r.topic, "retention_ms", r.keep, "retention_window", c.cfg.RetentionWindow)
		}
	}
}

// describeRetention reads retention.ms of topics with one DescribeConfigs
// request.
func describeRetention(ctx context.Context, cl *kgo.Client, topics []string) ([]topicRetention, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range topics {
		res := kmsg.NewDescribeConfigsRequestResource()
		res.ResourceType = kmsg.ConfigResourceTypeTopic
		res.ResourceName = t
		res.ConfigNames = []string{"retention.ms"}
		req.Resources = append(req.Resources, res)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	var out []topicRetention
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			return nil, err
		}
		for _, cfg := range res.Configs {
			if cfg.Name != "retention.ms" || cfg.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*cfg.Value, 10, 64)
			if err != nil {
				return nil, err
			}
			r := topicRetention{topic: res.ResourceName, forever: ms < 0}
			if ms >= 0 {
				r.keep = time.Duration(ms) * time.Millisecond
			}
			out = append(out, r)
		}
	}
	return out, nil
}
