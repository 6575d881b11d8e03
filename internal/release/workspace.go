package main

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// UnpublishedMarker is the comment that keeps a module out of every release:
// a line of its go.mod that starts with it (usually the first line, above
// the module directive). Test modules, examples and tools carry it; their
// go.mod may keep replace directives into the repository.
const UnpublishedMarker = "// idem:unpublished"

// module is one module of the workspace, as its go.mod says.
type module struct {
	Dir         string // relative to the repository root, slash-separated; "." for the root
	Path        string // module path
	Unpublished bool   // go.mod carries UnpublishedMarker
	File        *modfile.File
}

// Tag is the git tag of the module at version: the version for the root
// module, the directory and the version otherwise (store/idempgxv5/v0.3.0),
// as the go command looks modules up in a repository's subdirectories.
func (m *module) Tag(version string) string {
	if m.Dir == "." {
		return version
	}
	return m.Dir + "/" + version
}

// workspace is the repository's go.work and its modules.
type workspace struct {
	Root    string
	Modules []*module          // in go.work's order
	byPath  map[string]*module // module path -> module
}

// loadWorkspace reads root/go.work and the go.mod of each module it uses.
func loadWorkspace(root string) (*workspace, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, fmt.Errorf("reading the workspace: %w", err)
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	ws := &workspace{Root: root, byPath: map[string]*module{}}
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if path.IsAbs(dir) || dir == ".." || strings.HasPrefix(dir, "../") {
			return nil, fmt.Errorf("go.work uses %s, outside the repository", u.Path)
		}
		gomod := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
		data, err := os.ReadFile(gomod)
		if err != nil {
			return nil, fmt.Errorf("module %s in go.work: %w", dir, err)
		}
		f, err := modfile.Parse(gomod, data, nil)
		if err != nil {
			return nil, err
		}
		if f.Module == nil {
			return nil, fmt.Errorf("%s has no module directive", gomod)
		}
		m := &module{Dir: dir, Path: f.Module.Mod.Path, Unpublished: hasMarker(data), File: f}
		if prev := ws.byPath[m.Path]; prev != nil {
			return nil, fmt.Errorf("module %s is in go.work twice (%s and %s)", m.Path, prev.Dir, dir)
		}
		ws.byPath[m.Path] = m
		ws.Modules = append(ws.Modules, m)
	}
	if len(ws.Modules) == 0 {
		return nil, errors.New("go.work uses no module")
	}
	return ws, nil
}

func hasMarker(gomod []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if strings.HasPrefix(strings.TrimSpace(sc.Text()), UnpublishedMarker) {
			return true
		}
	}
	return false
}

// deps is the workspace modules m requires, by module path.
func (ws *workspace) deps(m *module) []*module {
	var out []*module
	for _, r := range m.File.Require {
		if d := ws.byPath[r.Mod.Path]; d != nil {
			out = append(out, d)
		}
	}
	return out
}

// published is the modules to tag, each after every workspace module it
// requires (a topological order; modules whose order is free are sorted
// by directory, the root first).
func (ws *workspace) published() ([]*module, error) {
	var todo []*module
	for _, m := range ws.Modules {
		if !m.Unpublished {
			todo = append(todo, m)
		}
	}
	// "." sorts before any directory name, so the root comes first.
	slices.SortFunc(todo, func(a, b *module) int { return cmp.Compare(a.Dir, b.Dir) })
	// Level by level: each pass takes every module whose workspace
	// dependencies are all tagged by earlier passes (the root, then what
	// needs only the root, ... cmd/idem last).
	done := map[*module]bool{}
	var order []*module
	for len(todo) > 0 {
		var level, rest []*module
		for _, m := range todo {
			ready := true
			for _, d := range ws.deps(m) {
				if !d.Unpublished && !done[d] && d != m {
					ready = false
					break
				}
			}
			if ready {
				level = append(level, m)
			} else {
				rest = append(rest, m)
			}
		}
		if len(level) == 0 {
			var dirs []string
			for _, m := range rest {
				dirs = append(dirs, m.Dir)
			}
			return nil, fmt.Errorf("the workspace modules %s require each other in a cycle", strings.Join(dirs, ", "))
		}
		for _, m := range level {
			done[m] = true
		}
		order = append(order, level...)
		todo = rest
	}
	return order, nil
}

// checkVersion refuses a version the go command would not accept for the
// module: not canonical semver, or a major version above 1 on a module
// path without the matching /vN suffix.
func checkVersion(version string, mods []*module) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version || semver.Build(version) != "" {
		return fmt.Errorf("version %q is not a canonical semantic version like v0.3.0 or v1.0.0-rc.1", version)
	}
	major := semver.Major(version)
	if major == "v0" || major == "v1" {
		return nil
	}
	var errs []error
	for _, m := range mods {
		if !strings.HasSuffix(m.Path, "/"+major) {
			errs = append(errs, fmt.Errorf("%s: version %s needs the module path to end in /%s", m.Dir, version, major))
		}
	}
	return errors.Join(errs...)
}

// checkModules reports every go.mod problem that would make version
// unusable once tagged: a published module requiring another version of a
// workspace module than the one being tagged, requiring a module that is
// never published, or keeping a directory replace (`go install pkg@version`
// refuses a module with replace directives, and a user's build never sees
// the directory). When prepare would rewrite some of them, a last error
// says to run it.
func (ws *workspace) checkModules(version string, order []*module) error {
	var errs []error
	rewrite := false // a require or replace that prepare rewrites
	for _, m := range order {
		for _, r := range m.File.Require {
			d := ws.byPath[r.Mod.Path]
			switch {
			case d == nil:
			case d.Unpublished:
				errs = append(errs, fmt.Errorf("%s: requires %s, which is never published (%s in its go.mod)", m.Dir, d.Path, UnpublishedMarker))
			case r.Mod.Version != version:
				errs = append(errs, fmt.Errorf("%s: requires %s %s, not the %s being tagged", m.Dir, d.Path, r.Mod.Version, version))
				rewrite = true
			}
		}
		for _, r := range m.File.Replace {
			if modfile.IsDirectoryPath(r.New.Path) {
				errs = append(errs, fmt.Errorf("%s: replace %s => %s must go before a release", m.Dir, r.Old.Path, r.New.Path))
				rewrite = true
			}
		}
	}
	if rewrite {
		errs = append(errs, fmt.Errorf("scripts/release prepare -apply %s rewrites these requires and replaces; commit them, then run this again", version))
	}
	return errors.Join(errs...)
}

// git runs git in dir and returns its trimmed standard output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimRight(string(out), "\r\n\t "), nil
}

// checkClean refuses a work tree with changes, staged or not, or files
// that are neither tracked nor ignored: the tags would name a commit that
// is not what was tested.
func checkClean(root string) error {
	out, err := git(root, "status", "--porcelain")
	if err != nil {
		return err
	}
	if out != "" {
		return fmt.Errorf("the work tree is not clean; commit or stash first:\n%s", out)
	}
	return nil
}

// checkNewer refuses a version that is not above the last release (the
// highest root tag): the go command's "latest" is the highest version, so
// a lower one would never be picked up.
func checkNewer(root, version string) error {
	last, err := lastRelease(root)
	if err != nil || last == "" || semver.Compare(version, last) > 0 {
		return err
	}
	return fmt.Errorf("version %s is not above the last release %s", version, last)
}

// checkTags refuses a tag that exists already: a published version is
// immutable (the checksum database remembers it).
func checkTags(root, version string, order []*module) error {
	var errs []error
	for _, m := range order {
		tag := m.Tag(version)
		if _, err := git(root, "rev-parse", "-q", "--verify", "refs/tags/"+tag); err == nil {
			errs = append(errs, fmt.Errorf("tag %s exists already", tag))
		}
	}
	return errors.Join(errs...)
}
