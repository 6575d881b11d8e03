package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The tests build a small workspace in a temporary git repository:
//
//	.              example.com/ws             (needs nothing)
//	store/s        example.com/ws/store/s     (needs the root)
//	adapter/a      example.com/ws/adapter/a   (needs the root and store/s)
//	cmd/c          example.com/ws/cmd/c       (needs adapter/a and the root)
//	cmd/c/internal/ctest  (unpublished test module, needs cmd/c, keeps its replaces)
//
// listed in go.work in an order that is not the release order.

// setIdentity gives git an author and committer (CI has none configured).
func setIdentity(t *testing.T) {
	for _, k := range []string{"GIT_AUTHOR", "GIT_COMMITTER"} {
		t.Setenv(k+"_NAME", "release test")
		t.Setenv(k+"_EMAIL", "release@example.com")
	}
	t.Setenv("GIT_CONFIG_GLOBAL", os.DevNull)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
}

func gomod(path, version string, deps ...string) string {
	var b strings.Builder
	b.WriteString("module " + path + "\n\ngo 1.26\n")
	for _, d := range deps {
		b.WriteString("\nrequire " + d + " " + version + "\n")
	}
	return b.String()
}

// newRepo writes files (slash paths) into a new git repository and commits them.
func newRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	setIdentity(t)
	root := t.TempDir()
	for name, data := range files {
		writeTestFile(t, root, name, data)
	}
	mustGit(t, root, "init", "-q", "-b", "main")
	mustGit(t, root, "add", "-A")
	mustGit(t, root, "commit", "-q", "-m", "start")
	return root
}

func writeTestFile(t *testing.T, root, name, data string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := git(dir, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func commitAll(t *testing.T, root, msg string) {
	t.Helper()
	mustGit(t, root, "add", "-A")
	mustGit(t, root, "commit", "-q", "-m", msg)
}

// released is the sample workspace with every go.mod ready for version.
func released(version string) map[string]string {
	return map[string]string{
		"go.work":          "go 1.26\n\nuse (\n\t./cmd/c\n\t./cmd/c/internal/ctest\n\t./adapter/a\n\t./store/s\n\t.\n)\n",
		"go.mod":           gomod("example.com/ws", version),
		"ws.go":            "// Package ws is the root.\npackage ws\n\n// F is the API.\nfunc F() {}\n",
		"store/s/go.mod":   gomod("example.com/ws/store/s", version, "example.com/ws"),
		"store/s/s.go":     "package s\n",
		"adapter/a/go.mod": gomod("example.com/ws/adapter/a", version, "example.com/ws/store/s", "example.com/ws"),
		"adapter/a/a.go":   "package a\n",
		"cmd/c/go.mod":     gomod("example.com/ws/cmd/c", version, "example.com/ws/adapter/a", "example.com/ws"),
		"cmd/c/main.go":    "package main\n\nfunc main() {}\n",
		"cmd/c/internal/ctest/go.mod": UnpublishedMarker + " — tests only\n" +
			gomod("example.com/ws/cmd/c/internal/ctest", "v0.0.0", "example.com/ws/cmd/c") +
			"\nreplace example.com/ws/cmd/c => ../..\n",
		"cmd/c/internal/ctest/ctest.go": "package ctest\n",
	}
}

func runTool(t *testing.T, root string, args ...string) (string, error) {
	t.Helper()
	t.Chdir(root)
	var out bytes.Buffer
	err := run(&out, args)
	return out.String(), err
}

func tags(t *testing.T, root string) []string {
	t.Helper()
	return strings.Fields(mustGit(t, root, "tag", "--list"))
}

func TestReleaseOrderAndDryRun(t *testing.T) {
	root := newRepo(t, released("v0.2.0"))

	out, err := runTool(t, root, "v0.2.0")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	want := []string{"v0.2.0", "store/s/v0.2.0", "adapter/a/v0.2.0", "cmd/c/v0.2.0"}
	var got []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && strings.HasSuffix(f[0], ".") {
			got = append(got, f[1])
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("tag order = %v, want %v\n%s", got, want, out)
	}
	if !strings.Contains(out, "not published: cmd/c/internal/ctest") {
		t.Errorf("the unpublished module is not reported as skipped:\n%s", out)
	}
	if tg := tags(t, root); len(tg) != 0 {
		t.Fatalf("a dry run created tags %v", tg)
	}

	out, err = runTool(t, root, "-apply", "v0.2.0")
	if err != nil {
		t.Fatalf("-apply: %v\n%s", err, out)
	}
	if tg := tags(t, root); !slices.Equal(sorted(tg), sorted(want)) {
		t.Fatalf("tags = %v, want %v", tg, want)
	}
	head := mustGit(t, root, "rev-parse", "HEAD")
	for _, tg := range want {
		if c := mustGit(t, root, "rev-parse", tg+"^{commit}"); c != head {
			t.Errorf("%s names %s, not HEAD %s", tg, c, head)
		}
	}

	// A version below the last release is refused.
	if out, err := runTool(t, root, "v0.1.9"); err == nil || !strings.Contains(err.Error(), "version v0.1.9 is not above the last release v0.2.0") {
		t.Errorf("release of v0.1.9 after v0.2.0: err %v\n%s", err, out)
	}

	// Tagging the same version again is refused, every tag named.
	out, err = runTool(t, root, "v0.2.0")
	if err == nil {
		t.Fatalf("a second release of v0.2.0 passed:\n%s", out)
	}
	for _, tg := range want {
		if !strings.Contains(err.Error(), "tag "+tg+" exists already") {
			t.Errorf("error does not name the existing tag %s: %v", tg, err)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestReleaseRefusals(t *testing.T) {
	for _, tt := range []struct {
		name      string
		edit      func(files map[string]string)
		dirty     bool
		wantIn    []string
		wantNotIn []string
	}{
		{
			name: "stale require",
			edit: func(f map[string]string) {
				f["adapter/a/go.mod"] = gomod("example.com/ws/adapter/a", "v0.1.0", "example.com/ws/store/s", "example.com/ws")
			},
			wantIn: []string{
				"adapter/a: requires example.com/ws/store/s v0.1.0, not the v0.2.0 being tagged",
				"adapter/a: requires example.com/ws v0.1.0, not the v0.2.0 being tagged",
				"scripts/release prepare -apply v0.2.0 rewrites these",
			},
		},
		{
			name: "replace into the repository",
			edit: func(f map[string]string) {
				f["store/s/go.mod"] += "\nreplace example.com/ws => ../..\n"
			},
			wantIn: []string{"store/s: replace example.com/ws => ../.. must go before a release", "scripts/release prepare -apply v0.2.0 rewrites these"},
		},
		{
			name: "published requires unpublished",
			edit: func(f map[string]string) {
				f["store/s/go.mod"] += "\nrequire example.com/ws/cmd/c/internal/ctest v0.2.0\n"
			},
			wantIn:    []string{"store/s: requires example.com/ws/cmd/c/internal/ctest, which is never published"},
			wantNotIn: []string{"prepare"}, // prepare does not drop a require
		},
		{
			name:   "dirty tree",
			dirty:  true,
			wantIn: []string{"the work tree is not clean", "?? stray.txt"},
		},
		{
			name:   "not a version",
			wantIn: []string{`version "v0.2" is not a canonical semantic version`},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			files := released("v0.2.0")
			if tt.edit != nil {
				tt.edit(files)
			}
			root := newRepo(t, files)
			if tt.dirty {
				writeTestFile(t, root, "stray.txt", "x")
			}
			version := "v0.2.0"
			if tt.name == "not a version" {
				version = "v0.2"
			}
			for _, apply := range [][]string{nil, {"-apply"}} {
				out, err := runTool(t, root, append(apply, version)...)
				if err == nil {
					t.Fatalf("release %v passed:\n%s", apply, out)
				}
				for _, w := range tt.wantIn {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error lacks %q:\n%v", w, err)
					}
				}
				for _, w := range tt.wantNotIn {
					if strings.Contains(err.Error(), w) {
						t.Errorf("error holds %q:\n%v", w, err)
					}
				}
				if tg := tags(t, root); len(tg) != 0 {
					t.Fatalf("a refused release created tags %v", tg)
				}
			}
		})
	}
}

func TestPrepareThenRelease(t *testing.T) {
	files := released("v0.0.0")
	for _, dir := range []string{"store/s", "adapter/a", "cmd/c"} {
		files[dir+"/go.mod"] += "\nreplace example.com/ws => " + strings.Repeat("../", strings.Count(dir, "/")+1) + "\n"
	}
	root := newRepo(t, files)

	if _, err := runTool(t, root, "v0.3.0"); err == nil {
		t.Fatal("release passed with v0.0.0 requires and replaces")
	}
	out, err := runTool(t, root, "prepare", "v0.3.0")
	if err != nil {
		t.Fatalf("prepare dry run: %v\n%s", err, out)
	}
	if st := mustGit(t, root, "status", "--porcelain"); st != "" {
		t.Fatalf("prepare without -apply changed files:\n%s", st)
	}
	if _, err := runTool(t, root, "prepare", "-apply", "v0.3.0"); err != nil {
		t.Fatal(err)
	}
	ctest, err := os.ReadFile(filepath.Join(root, "cmd/c/internal/ctest/go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if string(ctest) != files["cmd/c/internal/ctest/go.mod"] {
		t.Errorf("prepare rewrote the unpublished module's go.mod:\n%s", ctest)
	}
	commitAll(t, root, "release v0.3.0")
	if out, err := runTool(t, root, "-apply", "v0.3.0"); err != nil {
		t.Fatalf("release after prepare: %v\n%s", err, out)
	}
	if n := len(tags(t, root)); n != 4 {
		t.Errorf("%d tags, want 4", n)
	}
	// The prepared workspace still builds in workspace mode.
	cmd := exec.Command("go", "build", "./...")
	cmd.Dir = filepath.Join(root, "cmd/c")
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(root, "go.work"), "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build in the prepared workspace: %v\n%s", err, out)
	}
}

func TestAPICheck(t *testing.T) {
	root := newRepo(t, released("v0.2.0"))

	out, err := runTool(t, root, "apicheck")
	if err != nil || !strings.Contains(out, "no release tag (v*) yet") {
		t.Fatalf("apicheck without a tag: err %v\n%s", err, out)
	}

	if _, err := runTool(t, root, "-apply", "v0.2.0"); err != nil {
		t.Fatal(err)
	}
	// A new identifier is compatible.
	writeTestFile(t, root, "ws.go", "// Package ws is the root.\npackage ws\n\n// F is the API.\nfunc F() {}\n\n// G is new.\nfunc G() {}\n")
	out, err = runTool(t, root, "apicheck")
	if err != nil || !strings.Contains(out, "against v0.2.0: 1 compatible change(s), 0 incompatible") {
		t.Fatalf("apicheck after adding G: err %v\n%s", err, out)
	}

	// A changed signature and a removed package are not.
	writeTestFile(t, root, "ws.go", "// Package ws is the root.\npackage ws\n\n// F is the API.\nfunc F(n int) {}\n")
	if err := os.Remove(filepath.Join(root, "adapter/a/a.go")); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, root, "adapter/a/b/b.go", "package b\n")
	out, err = runTool(t, root, "apicheck")
	if err == nil {
		t.Fatalf("apicheck passed an incompatible change:\n%s", out)
	}
	for _, w := range []string{"incompatible: example.com/ws: F: changed from func() to func(int)", "example.com/ws/adapter/a"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if !strings.Contains(err.Error(), "declare the break in CHANGELOG.md") {
		t.Errorf("error does not say how to declare a break: %v", err)
	}

	// Declared in the changelog's Unreleased section, the break passes.
	writeTestFile(t, root, "CHANGELOG.md", "# Changelog\n\n## [Unreleased]\n\n### Breaking\n\n- F takes n.\n\n## [0.2.0]\n")
	out, err = runTool(t, root, "apicheck")
	if err != nil || !strings.Contains(out, "CHANGELOG.md declares the break") || !strings.Contains(out, "a new minor version") {
		t.Fatalf("apicheck with a declared break: err %v\n%s", err, out)
	}
	// In the release commit, under the heading of the version about to be
	// tagged, it still counts.
	writeTestFile(t, root, "CHANGELOG.md", "# Changelog\n\n## [Unreleased]\n\n## [0.3.0] - 2026-12-06\n\n### Breaking\n\n- F takes n.\n\n## [0.2.0]\n")
	out, err = runTool(t, root, "apicheck")
	if err != nil || !strings.Contains(out, "CHANGELOG.md declares the break") {
		t.Fatalf("apicheck with the break under [0.3.0]: err %v\n%s", err, out)
	}
	// Under an older release's heading it does not count.
	writeTestFile(t, root, "CHANGELOG.md", "# Changelog\n\n## [Unreleased]\n\n## [0.2.0]\n\n### Breaking\n")
	if _, err := runTool(t, root, "apicheck"); err == nil {
		t.Fatal("a Breaking heading under a released version let the check pass")
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"v1.0.0", "v1.0.1"}, {"apicheck", "-apply"}, {"list", "x"}, {"-nope"}} {
		if _, err := runTool(t, t.TempDir(), args...); err == nil {
			t.Errorf("run(%q) passed", args)
		}
	}
}
