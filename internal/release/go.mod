// idem:unpublished — the release tool; scripts/release runs it from the workspace.
module github.com/idem-go/idem/internal/release

go 1.26.0

require (
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
	golang.org/x/mod v0.43.0
	golang.org/x/tools v0.53.0
)

require golang.org/x/sync v0.25.0 // indirect
