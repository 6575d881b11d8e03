package idemkafka

import (
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

func TestRecordHeaders(t *testing.T) {
	t.Parallel()
	if h := recordHeaders(&kgo.Record{}); h != nil {
		t.Errorf("no headers: %v, want nil", h)
	}
	r := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte("m-1")}, {Key: "trace", Value: []byte("a")}, {Key: "trace", Value: []byte("b")}}}
	want := idem.Headers{"message-id": {"m-1"}, "trace": {"a", "b"}}
	if h := recordHeaders(r); !reflect.DeepEqual(h, want) {
		t.Errorf("recordHeaders = %v, want %v", h, want)
	}
}
