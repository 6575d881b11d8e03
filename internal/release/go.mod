// idem:unpublished — the release tool; scripts/release runs it from the workspace.
module github.com/idem-go/idem/internal/release

go 1.26.0

require (
	golang.org/x/exp v0.0.0-20261014143641-f0251eb4aa3e
	golang.org/x/mod v0.42.0
	golang.org/x/tools v0.52.0
)

require golang.org/x/sync v0.24.0 // indirect
