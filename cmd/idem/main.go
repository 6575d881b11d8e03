// Command idem runs the Idempotent Consumer pattern end to end (idem demo)
// and operates idem's tables (migrate, purge, inspect, stats).
package main

import (
	"os"

	"github.com/idem-go/idem/cmd/idem/idemcli"
)

func main() {
	os.Exit(idemcli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
