package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/gorun/gorun/internal/agent"
)

const cleanUsageHead = `Usage: gorun clean [-n]

Removes what your ended gorun jobs left on this host, as Open MPI's
orte-clean does: agents killed before they could clean up (every agent
of a job killed at once, the last agent on a host killed) leave their
job directory in TMPDIR (gorun-<job>-<n>.agent), their socket directory
in /dev/shm (gorun-<job>-<n>.sock), the ranks' protected state there
(gorun-<job>.*) and Open MPI's directories
(gorun-<job>-h<host>-g<generation>). Only what no running gorun agent
holds is removed: the jobs running meanwhile keep theirs. MPICH's
shared-memory files in /dev/shm (mpich_shar_tmp*, left by ranks killed
in MPI_Init) are removed too, whatever job made them, when they are
yours, 2 s old or more, and no process has them open or mapped (the
kernel grants a write lease on them); with leases off
(fs.leases-enable=0) they are kept. Job directories are looked at only
when TMPDIR is on a local file system, socket directories only when
/dev/shm is a tmpfs.
Prints what it removed, one per line.

`

const cleanUsageTail = `
Exit status: 0 done (also when there was nothing to remove); 1 something
could not be removed; 2 a usage error.
`

// cleanUsage is `gorun clean -h`, its flags from cleanFlags.
func cleanUsage() string {
	return flagUsage(cleanUsageHead, cleanFlags(&agent.CleanOptions{}), []flagGroup{{}}, 18, "", cleanUsageTail)
}

// cleanFlags describes gorun clean's flags, bound to o.
func cleanFlags(o *agent.CleanOptions) []flagSpec {
	return []flagSpec{
		{names: []string{"-n", "--dry-run"}, define: boolFlag(&o.DryRun, false),
			help: "list what would be removed, removing nothing"},
	}
}

// cleanMain runs `gorun clean`.
func cleanMain(args []string, stdout, stderr io.Writer) int {
	return runClean(args, agent.CleanOptions{}, stdout, stderr)
}

// runClean runs gorun clean in the directories of o (tests: their own).
func runClean(args []string, o agent.CleanOptions, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gorun clean", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defineFlags(fs, cleanFlags(&o))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, cleanUsage())
			return exitOK
		}
		fmt.Fprintf(stderr, "gorun clean: %v\nRun 'gorun clean -h' for usage.\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gorun clean: unexpected argument %q\nRun 'gorun clean -h' for usage.\n", fs.Arg(0))
		return exitUsage
	}
	c, err := agent.Clean(o)
	verb := "removed"
	if o.DryRun {
		verb = "would remove"
	}
	for _, d := range c.JobDirs {
		fmt.Fprintf(stdout, "%s job directory %s\n", verb, d)
	}
	for _, d := range c.SockDirs {
		fmt.Fprintf(stdout, "%s socket directory %s\n", verb, d)
	}
	for _, j := range c.SlotJobs {
		fmt.Fprintf(stdout, "%s protected state of job %s in %s\n", verb, j, c.ShmDir)
	}
	for _, d := range c.OMPIDirs {
		fmt.Fprintf(stdout, "%s Open MPI directory %s\n", verb, d)
	}
	for _, f := range c.MPICHFiles {
		fmt.Fprintf(stdout, "%s MPICH shared-memory file %s\n", verb, f)
	}
	if c.NotSwept != "" {
		fmt.Fprintf(stderr, "gorun clean: job directories not looked at: %s\n", c.NotSwept)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun clean: %v\n", err)
		return exitError
	}
	return exitOK
}
