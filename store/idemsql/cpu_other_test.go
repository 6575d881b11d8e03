//go:build !unix

package idemsql_test

import "time"

// processCPU returns 0 where getrusage is missing: no CPU metric.
func processCPU() time.Duration { return 0 }
