package idemsql

import "testing"

// TestMariaDBReturning checks which server versions get the RETURNING
// batch claim: MariaDB from 10.5 on, never MySQL.
func TestMariaDBReturning(t *testing.T) {
	for v, want := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"10.5.0-MariaDB":             true,
		"11.4.2-MariaDB-log":         true,
		"10.4.32-MariaDB":            false,
		"5.5.5-10.11.6-MariaDB":      false, // the old replication prefix: not parsed as 10.11
		"8.0.36":                     false,
		"8.4.0-commercial":           false,
		"":                           false,
	} {
		if got := mariaDBReturning(v); got != want {
			t.Errorf("mariaDBReturning(%q) = %v, want %v", v, got, want)
		}
	}
}
