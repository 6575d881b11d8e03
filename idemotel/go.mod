module github.com/idem-go/idem/idemotel

go 1.26.0

require github.com/idem-go/idem v0.0.0

replace github.com/idem-go/idem => ..
