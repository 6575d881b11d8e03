//go:build !nodemo

package idemcli

// The demo is part of the default build; `go build -tags nodemo` leaves it
// out, and with it the embedded NATS server and kfake it links.
func init() { extraCommands = append(extraCommands, newDemoCmd) }
