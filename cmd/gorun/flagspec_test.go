package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestRunFlagsHelpNamesDefault: the help text of each flag with a default
// other than zero names it, so that the table's default and the help
// cannot drift apart.
func TestRunFlagsHelpNamesDefault(t *testing.T) {
	fs := flag.NewFlagSet("gorun", flag.ContinueOnError)
	specs := runFlags(&runOptions{}, &runFlagArgs{})
	defineFlags(fs, specs)
	for _, s := range specs {
		def := fs.Lookup(flagName(s.names[0])).DefValue
		switch def {
		case "", "0", "false", "[]":
			continue
		}
		if !strings.Contains(strings.ToLower(s.help), "default") || !strings.Contains(s.help, def) {
			t.Errorf("%s: the help %q does not give its default %s", s.names[0], s.help, def)
		}
	}
}

// TestUsageListsEveryFlag: gorun --help gives every name of every flag
// that is not hidden, with its argument, at the start of a line.
func TestUsageListsEveryFlag(t *testing.T) {
	usage := runUsage()
	for _, s := range runFlags(&runOptions{}, &runFlagArgs{}) {
		if s.hidden {
			continue
		}
		if syn := flagSynopsis(s); !strings.Contains(usage, "\n  "+syn+" ") && !strings.Contains(usage, "\n  "+syn+"\n") {
			t.Errorf("the usage text does not list %q", syn)
		}
	}
	if !strings.HasPrefix(usage, "Usage: gorun [flags] [--] PROG [ARGS...]\n") {
		t.Errorf("the usage text starts %q", usage[:min(len(usage), 60)])
	}
}

// TestFlagAliases: every name of a flag sets the same value, and a bool
// flag's aliases stay bool flags (-v takes no argument).
func TestFlagAliases(t *testing.T) {
	tests := []struct {
		args []string
		ok   func(o *runOptions) bool
	}{
		{[]string{"-np", "3"}, func(o *runOptions) bool { return o.np == 3 }},
		{[]string{"-n", "3"}, func(o *runOptions) bool { return o.np == 3 }},
		{[]string{"--hostfile", "h"}, func(o *runOptions) bool { return o.hostfile == "h" }},
		{[]string{"-f", "h"}, func(o *runOptions) bool { return o.hostfile == "h" }},
		{[]string{"--machinefile", "h"}, func(o *runOptions) bool { return o.hostfile == "h" }},
		{[]string{"-H", "a,b"}, func(o *runOptions) bool { return o.hostList == "a,b" }},
		{[]string{"--host", "a,b"}, func(o *runOptions) bool { return o.hostList == "a,b" }},
		{[]string{"-v"}, func(o *runOptions) bool { return o.verbose }},
		{[]string{"--verbose"}, func(o *runOptions) bool { return o.verbose }},
		{[]string{"-x", "A", "-x", "B=1"}, func(o *runOptions) bool { return strings.Join(o.exports, " ") == "A B=1" }},
		{[]string{"--pmi=false"}, func(o *runOptions) bool { return !o.pmi }},
		{[]string{}, func(o *runOptions) bool {
			return o.pmi && o.tagOutput && o.mapBy == "slot" && o.killGrace.Seconds() == 10
		}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			o, err := parseRun(append(tt.args, "prog"), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.ok(o) || o.prog != "prog" {
				t.Errorf("gorun %q: options %+v", tt.args, o)
			}
		})
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}} {
		if _, err := parseRun(args, io.Discard); err != errHelp {
			t.Errorf("gorun %q: %v, want errHelp", args, err)
		}
	}
}
