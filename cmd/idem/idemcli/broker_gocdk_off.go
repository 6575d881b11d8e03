//go:build nogocdk

package idemcli

import "fmt"

// Built with -tags nogocdk: no Go CDK drivers, so gcppubsub://, awssqs://
// and mem:// are unknown schemes (broker_gocdk.go has them otherwise).

func isGoCDKURL(string) bool { return false }

func openGoCDK(rawURL string) (sidecarBroker, error) {
	return nil, usageError{fmt.Errorf("%w: broker %q: this idem was built with -tags nogocdk", errBadURL, redact(rawURL))}
}
