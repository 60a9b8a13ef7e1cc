package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// flagSpec describes one flag once: its names, its argument, its default
// (in define), its group and help text. Registration (defineFlags) and the
// usage text (formatFlags) are generated from a table of them, and
// readme_test.go checks README's flag table against gorun's.
type flagSpec struct {
	// names as written in the usage, dashes included ("-np", "-n";
	// "--hostfile", "-f", "--machinefile"): the first is the flag's
	// name, the others its aliases, which set the same value.
	names []string
	// arg names the flag's argument in the usage ("N", "FILE"): empty
	// for a bool flag, "[=false]" for one that is on by default.
	arg string
	// group is the usage section the flag is listed in.
	group string
	// help is the flag's usage text, wrapped (lines after the first are
	// indented to the help column).
	help string
	// hidden flags are registered and left out of the usage and README.
	hidden bool
	// define registers the flag under name in fs, with its default.
	define defineFunc
}

// defineFunc registers a flag under name in fs: one of intFlag, strFlag...
type defineFunc func(fs *flag.FlagSet, name string)

func intFlag(p *int, def int) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.IntVar(p, name, def, "") }
}

func strFlag(p *string, def string) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.StringVar(p, name, def, "") }
}

func boolFlag(p *bool, def bool) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.BoolVar(p, name, def, "") }
}

func uint64Flag(p *uint64, def uint64) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.Uint64Var(p, name, def, "") }
}

func floatFlag(p *float64, def float64) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.Float64Var(p, name, def, "") }
}

func durationFlag(p *time.Duration, def time.Duration) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.DurationVar(p, name, def, "") }
}

// secondsFlag is a duration given in seconds or as a Go duration (seconds).
func secondsFlag(p *time.Duration, def time.Duration) defineFunc {
	return func(fs *flag.FlagSet, name string) {
		*p = def
		fs.Var(seconds{p}, name, "")
	}
}

// listFlag is a repeatable string flag (stringList).
func listFlag(p *[]string) defineFunc {
	return func(fs *flag.FlagSet, name string) { fs.Var((*stringList)(p), name, "") }
}

// flagName is a name of the usage without its dashes, as the flag
// package knows it.
func flagName(n string) string { return strings.TrimLeft(n, "-") }

// defineFlags registers every flag of specs in fs: its first name through
// define, its aliases on the same flag.Value, each with the help text as
// its usage. (The flag package panics on a name defined twice.)
func defineFlags(fs *flag.FlagSet, specs []flagSpec) {
	for _, s := range specs {
		name := flagName(s.names[0])
		s.define(fs, name)
		f := fs.Lookup(name)
		f.Usage = s.help
		for _, alias := range s.names[1:] {
			fs.Var(f.Value, flagName(alias), s.help)
		}
	}
}

// flagGroup is a section of a usage text: its title, and a note printed
// after its flags.
type flagGroup struct {
	title string
	note  string
}

// formatFlags writes the usage lines of specs: per group (in the order
// of groups; a spec's group must be one of them), the title, then each
// flag that is not hidden, its names and argument from column 2 and its
// help from column col (on the next line when the names reach it), then
// the group's note. Groups are separated by gap ("\n": a blank line, or
// ""); a group without a title lists its flags alone.
func formatFlags(b *strings.Builder, specs []flagSpec, groups []flagGroup, col int, gap string) {
	checkFlagGroups(specs, groups)
	pad := strings.Repeat(" ", col)
	for i, g := range groups {
		if i > 0 {
			b.WriteString(gap)
		}
		if g.title != "" {
			b.WriteString(g.title + ":\n")
		}
		for _, s := range specs {
			if s.group != g.title || s.hidden {
				continue
			}
			head := "  " + flagSynopsis(s)
			if len(head) < col {
				head += pad[len(head):]
			} else {
				head += "\n" + pad
			}
			b.WriteString(head + strings.ReplaceAll(s.help, "\n", "\n"+pad) + "\n")
		}
		if g.note != "" {
			b.WriteString("  " + g.note + "\n")
		}
	}
}

// flagSynopsis is a flag's names and argument: "-np, -n N", "--pmi[=false]".
func flagSynopsis(s flagSpec) string {
	syn := strings.Join(s.names, ", ")
	switch {
	case s.arg == "":
	case strings.HasPrefix(s.arg, "["):
		syn += s.arg
	default:
		syn += " " + s.arg
	}
	return syn
}

// checkFlagGroups panics if a spec names a group not in groups: a flag
// the usage would leave out (at init: every usage text is built then).
func checkFlagGroups(specs []flagSpec, groups []flagGroup) {
	for _, s := range specs {
		found := false
		for _, g := range groups {
			found = found || g.title == s.group
		}
		if !found {
			panic(fmt.Sprintf("flag %s: group %q is not in the usage", s.names[0], s.group))
		}
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// seconds is a duration flag given in (fractional) seconds, or as a Go
// duration such as 1m30s.
type seconds struct{ d *time.Duration }

func (s seconds) String() string {
	if s.d == nil {
		return "0"
	}
	return strconv.FormatFloat(s.d.Seconds(), 'g', -1, 64)
}

func (s seconds) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || f > 1e9 {
			return fmt.Errorf("%s seconds is out of range", v)
		}
		*s.d = time.Duration(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return fmt.Errorf("%q is not a number of seconds", v)
	}
	*s.d = d
	return nil
}

// flagUsage is a usage text: head, the flags of specs (formatFlags) and
// tail.
func flagUsage(head string, specs []flagSpec, groups []flagGroup, col int, gap, tail string) string {
	var b strings.Builder
	b.WriteString(head)
	formatFlags(&b, specs, groups, col, gap)
	b.WriteString(tail)
	return b.String()
}
