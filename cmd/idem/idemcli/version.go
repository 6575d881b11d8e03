package idemcli

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// vcsRevision is the revision to report when the build information has
// none: set it at link time where Go stamps none (a git worktree, whose
// .git is a file; -buildvcs=false), as in
//
//	go build -ldflags "-X github.com/idem-go/idem/cmd/idem/idemcli.vcsRevision=$(git rev-parse HEAD)" ./cmd/idem
var vcsRevision string

// buildInfo is what `idem version` reports, read from the binary's build
// information (runtime/debug.ReadBuildInfo).
type buildInfo struct {
	Module    string `json:"module"`
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go"`
}

// readBuildInfo reads the main module's version ("(devel)" for a build
// from a checkout) and the VCS revision, commit time and dirty flag that
// go build stamps (-buildvcs, on by default in a git work tree); the
// revision is empty for `go run` and test binaries, which carry none.
func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildInfo{Module: "github.com/idem-go/idem/cmd/idem", Version: "unknown"}
	}
	out := buildInfo{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			out.Revision = s.Value
		case "vcs.time":
			out.Time = s.Value
		case "vcs.modified":
			out.Modified = s.Value == "true"
		}
	}
	if out.Revision == "" {
		out.Revision = vcsRevision
	}
	return out
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the module version and the VCS revision of this binary",
		Long: `version prints the module version of this binary and the VCS revision,
commit time and dirty flag it was built from (from its build information).

Go stamps the revision when it builds in a git clone with -buildvcs on (the
default, "auto"; check that "go env GOFLAGS" does not hold -buildvcs=false,
or build with -buildvcs=true). "go run", a build with -buildvcs=false and a
build in a git worktree (whose .git is a file) carry none; there, set it with
-ldflags "-X github.com/idem-go/idem/cmd/idem/idemcli.vcsRevision=$(git rev-parse HEAD)".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi := readBuildInfo()
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), bi)
			}
			printVersion(cmd.OutOrStdout(), bi)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printVersion(w io.Writer, bi buildInfo) {
	fmt.Fprintf(w, "%s %s", bi.Module, bi.Version)
	if bi.Revision == "" {
		fmt.Fprint(w, " (no VCS revision: see idem version --help)")
	} else {
		fmt.Fprintf(w, " revision %s", bi.Revision)
		if bi.Modified {
			fmt.Fprint(w, " (modified)")
		}
		if bi.Time != "" {
			fmt.Fprintf(w, " of %s", bi.Time)
		}
	}
	fmt.Fprintf(w, " %s\n", bi.GoVersion)
}
