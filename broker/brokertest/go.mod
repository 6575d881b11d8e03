module github.com/idem-go/idem/broker/brokertest

go 1.26.0

require github.com/idem-go/idem v0.0.0

replace (
	github.com/idem-go/idem => ../..
	github.com/idem-go/idem/store/idemsql => ../../store/idemsql
)
