//go:build !linux

package idempgxv5_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter measures nothing outside Linux.
type cpuMeter struct{}

func startCPU(testing.TB, *pgxpool.Pool) *cpuMeter { return &cpuMeter{} }

func startCPUs(testing.TB, ...*pgxpool.Pool) *cpuMeter { return &cpuMeter{} }

func (*cpuMeter) report(*testing.B, int) {}
