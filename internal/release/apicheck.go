package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/mod/semver"
	"golang.org/x/tools/go/packages"
)

// BreakingHeading, as a line of CHANGELOG.md's [Unreleased] section,
// declares that the next release breaks the API on purpose: apicheck still
// lists the incompatible changes but passes.
const BreakingHeading = "### Breaking"

// apiCheck compares the exported API of every module published at the
// release tag against (the highest v* tag when empty) with the work tree,
// with golang.org/x/exp/apidiff, and fails on an incompatible change (a
// removed or changed identifier, a removed package or module) unless
// CHANGELOG.md declares the break. Without any release tag there is
// nothing to compare and it passes. Internal packages and commands have no
// API and are left out. It needs git and the go command (and the module
// proxy for dependencies not yet in the module cache).
func apiCheck(w io.Writer, root, against string) error {
	if against == "" {
		if _, err := git(root, "rev-parse", "--git-dir"); err != nil {
			fmt.Fprintln(w, "apicheck: not a git repository; no release tag to compare with")
			return nil
		}
		var err error
		if against, err = lastRelease(root); err != nil {
			return err
		}
		if against == "" {
			fmt.Fprintln(w, "apicheck: no release tag (v*) yet; nothing to compare")
			return nil
		}
	}
	old, err := os.MkdirTemp("", "idem-apicheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(old)
	if err := extract(root, against, old); err != nil {
		return err
	}
	oldWS, err := loadWorkspace(old)
	if err != nil {
		return fmt.Errorf("at %s: %w", against, err)
	}
	newWS, err := loadWorkspace(root)
	if err != nil {
		return err
	}
	oldAPI, err := loadAPI(oldWS)
	if err != nil {
		return fmt.Errorf("loading the API at %s: %w", against, err)
	}
	newAPI, err := loadAPI(newWS)
	if err != nil {
		return fmt.Errorf("loading the API of the work tree: %w", err)
	}
	var breaks []string
	compatible := 0
	for _, om := range oldWS.Modules {
		if om.Unpublished {
			continue
		}
		nm := newWS.byPath[om.Path]
		if nm == nil || nm.Unpublished {
			breaks = append(breaks, fmt.Sprintf("%s: module no longer published", om.Path))
			continue
		}
		report := apidiff.ModuleChanges(
			&apidiff.Module{Path: om.Path, Packages: oldAPI[om.Path]},
			&apidiff.Module{Path: nm.Path, Packages: newAPI[nm.Path]})
		for _, c := range report.Changes {
			if c.Compatible {
				compatible++
			} else {
				breaks = append(breaks, fmt.Sprintf("%s: %s", om.Path, c.Message))
			}
		}
	}
	fmt.Fprintf(w, "apicheck against %s: %d compatible change(s), %d incompatible\n", against, compatible, len(breaks))
	for _, b := range breaks {
		fmt.Fprintf(w, "  incompatible: %s\n", b)
	}
	if len(breaks) == 0 {
		return nil
	}
	declared, err := breakDeclared(root, against)
	if err != nil {
		return err
	}
	if declared {
		fmt.Fprintf(w, "apicheck: CHANGELOG.md declares the break (%s under [Unreleased] or a version above %s); the next release must be %s\n", BreakingHeading, against, nextBreaking(against))
		return nil
	}
	return fmt.Errorf("%d incompatible API change(s) since %s: keep the old API, or declare the break in CHANGELOG.md (%s under [Unreleased]) and release %s next", len(breaks), against, BreakingHeading, nextBreaking(against))
}

// lastRelease is the highest root-module release tag (vX.Y.Z, pre-releases
// included), or "" when there is none.
func lastRelease(root string) (string, error) {
	out, err := git(root, "tag", "--list", "v*")
	if err != nil {
		return "", err
	}
	best := ""
	for _, t := range strings.Fields(out) {
		if semver.IsValid(t) && semver.Canonical(t) == t && (best == "" || semver.Compare(t, best) > 0) {
			best = t
		}
	}
	return best, nil
}

// nextBreaking names the versions a deliberate break needs after last:
// a new minor version below v1 (Go's convention for v0), a new major one
// from v1 on (with the /vN module path).
func nextBreaking(last string) string {
	if semver.Major(last) == "v0" {
		return "a new minor version (v0.N+1.0)"
	}
	return "a new major version (with /vN module paths)"
}

// breakDeclared reports whether CHANGELOG.md holds the BreakingHeading
// line in its [Unreleased] section or in the section of a version above
// against (a release commit, where [Unreleased] has been renamed to the
// version about to be tagged, "## [0.3.0] - 2026-12-06").
func breakDeclared(root, against string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.HasPrefix(line, "## [Unreleased]") || sectionAbove(line, against)
		case in && strings.HasPrefix(line, BreakingHeading):
			return true, nil
		}
	}
	return false, sc.Err()
}

// sectionAbove reports whether heading ("## [0.3.0] - date") names a
// version above against.
func sectionAbove(heading, against string) bool {
	_, rest, ok := strings.Cut(heading, "[")
	v, _, closed := strings.Cut(rest, "]")
	if !ok || !closed {
		return false
	}
	v = "v" + strings.TrimPrefix(v, "v")
	return semver.IsValid(v) && semver.Compare(v, against) > 0
}

// extract writes the tree of ref into dir (git archive, read here: no tar
// program needed).
func extract(root, ref, dir string) error {
	cmd := exec.Command("git", "archive", "--format=tar", ref)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			_ = cmd.Wait()
			return fmt.Errorf("git archive %s: %w", ref, err)
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			err = writeFile(target, tr, os.FileMode(h.Mode).Perm())
		}
		if err != nil {
			_ = cmd.Wait()
			return err
		}
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", ref, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func writeFile(name string, r io.Reader, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}

// loadAPI type-checks the packages of every published module of ws (in
// workspace mode, with ws's go.work) and groups them by module path,
// leaving out internal packages and commands.
func loadAPI(ws *workspace) (map[string][]*types.Package, error) {
	var patterns []string
	for _, m := range ws.Modules {
		if !m.Unpublished {
			patterns = append(patterns, "./"+path.Join(m.Dir, "..."))
		}
	}
	cfg := &packages.Config{
		Dir:  ws.Root,
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedModule,
		Env:  append(os.Environ(), "GOWORK="+filepath.Join(ws.Root, "go.work"), "GOFLAGS=-mod=readonly"),
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	api := map[string][]*types.Package{}
	var errs []error
	for _, p := range pkgs {
		if p.Module == nil || p.Name == "main" || isInternal(p.PkgPath) {
			continue
		}
		if m := ws.byPath[p.Module.Path]; m == nil || m.Unpublished {
			continue
		}
		for _, e := range p.Errors {
			errs = append(errs, e)
		}
		api[p.Module.Path] = append(api[p.Module.Path], p.Types)
	}
	return api, errors.Join(errs...)
}

func isInternal(pkgPath string) bool {
	for _, el := range strings.Split(pkgPath, "/") {
		if el == "internal" {
			return true
		}
	}
	return false
}
