module github.com/idem-go/idem/cmd/idem

go 1.26

require github.com/idem-go/idem v0.0.0

replace github.com/idem-go/idem => ../..
