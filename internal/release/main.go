// Command release tags every published module of the workspace for one
// version, and checks the exported API against the last release. It is run
// as scripts/release from the repository root; see docs/releasing.md.
//
//	scripts/release [-apply] VERSION           tag the published modules at HEAD, dependencies first
//	scripts/release prepare [-apply] VERSION   point the published go.mod files at VERSION
//	scripts/release apicheck [-against TAG]    exported API against the last release tag
//	scripts/release list                       the modules in release order, and the unpublished ones
//
// The modules are the ones go.work uses; one whose go.mod holds a line
// starting with "// idem:unpublished" is never tagged (tests, examples,
// tools). Every published module gets the same version, tagged with its
// directory as prefix (store/idempgxv5/v0.3.0; the root's tag is v0.3.0).
// Without -apply nothing is written: the run prints what it would do and
// fails on the first problem it would meet, after listing every one.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/mod/modfile"
)

func main() {
	if err := run(os.Stdout, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  scripts/release [-apply] VERSION           tag every published module at HEAD, dependencies first
  scripts/release prepare [-apply] VERSION   set the published go.mod files' requires to VERSION, drop their directory replaces
  scripts/release apicheck [-against TAG]    compare the exported API with the last release tag
  scripts/release list                       the modules in release order
Without -apply nothing is changed; see docs/releasing.md.`

// errUsage is returned for a command line the tool does not understand.
var errUsage = errors.New(usage)

func run(w io.Writer, args []string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	cmd := "tag"
	if len(args) > 0 {
		switch args[0] {
		case "prepare", "apicheck", "list":
			cmd, args = args[0], args[1:]
		case "-h", "-help", "--help", "help":
			fmt.Fprintln(w, usage)
			return nil
		}
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	apply := fs.Bool("apply", false, "do it (the default is a dry run)")
	against := fs.String("against", "", "the release tag to compare with (default: the highest v* tag)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w\n\n%s", err, usage)
	}
	switch cmd {
	case "list":
		if fs.NArg() != 0 {
			return errUsage
		}
		return list(w, root)
	case "apicheck":
		if fs.NArg() != 0 || *apply {
			return errUsage
		}
		return apiCheck(w, root, *against)
	}
	if fs.NArg() != 1 || *against != "" {
		return errUsage
	}
	if cmd == "prepare" {
		return prepare(w, root, fs.Arg(0), *apply)
	}
	return tag(w, root, fs.Arg(0), *apply)
}

// list prints the published modules in release order and the unpublished.
func list(w io.Writer, root string) error {
	ws, order, err := loadOrder(root)
	if err != nil {
		return err
	}
	for _, m := range order {
		fmt.Fprintf(w, "%-45s %s\n", m.Dir, m.Path)
	}
	fmt.Fprintf(w, "not published: %s\n", strings.Join(unpublishedDirs(ws), " "))
	return nil
}

// loadOrder reads the workspace at root and orders its published modules.
func loadOrder(root string) (*workspace, []*module, error) {
	ws, err := loadWorkspace(root)
	if err != nil {
		return nil, nil, err
	}
	order, err := ws.published()
	return ws, order, err
}

func unpublishedDirs(ws *workspace) []string {
	var out []string
	for _, m := range ws.Modules {
		if m.Unpublished {
			out = append(out, m.Dir)
		}
	}
	return out
}

// tag checks everything a release needs, prints the tags in order and,
// with apply, creates them as annotated tags on HEAD. It never pushes: it
// prints the push command.
func tag(w io.Writer, root, version string, apply bool) error {
	ws, order, err := loadOrder(root)
	if err != nil {
		return err
	}
	head, err := git(root, "rev-parse", "--short", "HEAD")
	if err != nil {
		return err
	}
	if err := errors.Join(
		checkVersion(version, order),
		checkClean(root),
		checkNewer(root, version),
		checkTags(root, version, order),
		ws.checkModules(version, order),
	); err != nil {
		return fmt.Errorf("cannot release %s:\n%w", version, err)
	}
	mode := "dry run; -apply creates the tags"
	if apply {
		mode = "creating the tags"
	}
	fmt.Fprintf(w, "release %s at %s (%s), dependencies first:\n", version, head, mode)
	var tags []string
	for i, m := range order {
		t := m.Tag(version)
		fmt.Fprintf(w, "%3d. %-45s %s\n", i+1, t, m.Path)
		if apply {
			if _, err := git(root, "tag", "-a", t, "-m", m.Path+" "+version, "HEAD"); err != nil {
				return fmt.Errorf("after creating %s: %w", strings.Join(tags, " "), err)
			}
		}
		tags = append(tags, t)
	}
	fmt.Fprintf(w, "not published: %s\n", strings.Join(unpublishedDirs(ws), " "))
	if apply {
		fmt.Fprintf(w, "created %d tags; publish them with:\n  git push origin %s\n", len(tags), strings.Join(tags, " "))
	} else {
		fmt.Fprintf(w, "then: git push origin %s\n", strings.Join(tags, " "))
	}
	return nil
}

// prepare points every published module's go.mod at version: each require
// of a workspace module is set to version and each replace of one by a
// directory is dropped. Unpublished modules keep theirs. With apply the
// files are rewritten (commit them, then tag); without, the changes are
// printed.
func prepare(w io.Writer, root, version string, apply bool) error {
	ws, order, err := loadOrder(root)
	if err != nil {
		return err
	}
	if err := checkVersion(version, order); err != nil {
		return err
	}
	changed := 0
	for _, m := range order {
		var edits []string
		for _, r := range m.File.Require {
			if ws.byPath[r.Mod.Path] != nil && r.Mod.Version != version {
				edits = append(edits, fmt.Sprintf("require %s %s (was %s)", r.Mod.Path, version, r.Mod.Version))
				if err := m.File.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
			}
		}
		for _, r := range m.File.Replace {
			if ws.byPath[r.Old.Path] != nil && modfile.IsDirectoryPath(r.New.Path) {
				edits = append(edits, fmt.Sprintf("drop replace %s => %s", r.Old.Path, r.New.Path))
				if err := m.File.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return err
				}
			}
		}
		if len(edits) == 0 {
			continue
		}
		changed++
		fmt.Fprintf(w, "%s/go.mod:\n", m.Dir)
		for _, e := range edits {
			fmt.Fprintf(w, "  %s\n", e)
		}
		if apply {
			m.File.Cleanup()
			data, err := m.File.Format()
			if err != nil {
				return err
			}
			if err := os.WriteFile(m.File.Syntax.Name, data, 0o644); err != nil {
				return err
			}
		}
	}
	switch {
	case changed == 0:
		fmt.Fprintf(w, "every published go.mod requires %s already\n", version)
	case apply:
		fmt.Fprintf(w, "rewrote %d go.mod files; commit them, then: scripts/release %s\n", changed, version)
	default:
		fmt.Fprintf(w, "%d go.mod files to change (dry run; -apply rewrites them)\n", changed)
	}
	return nil
}
