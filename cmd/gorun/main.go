// Command gorun launches SPMD jobs across hosts, mpirun style, and keeps
// them alive through failures. Run `gorun --help` for usage.
//
// A debugging aid, not a flag: with GORUN_DEBUG_GOROUTINES=FILE in its
// environment, `gorun run` writes the dump of its goroutines to FILE when
// it exits on its own (not when killed, or on SIGQUIT, whose own dump
// goes to standard error), once the job and everything the launcher owns
// is closed and its goroutines had up to a second to end
// (internal/gordump, which also says which of them are gorun's). The
// chaos suite reads it to find goroutines the launcher leaks.
//
// Another debugging aid, for the chaos suite's replica-flip fault: an
// agent process (`gorun agent`) with GORUN_DEBUG_FLIP_REPLICAS=FILE in
// its environment flips one byte of every complete replica its host
// holds for other ranks each time it gets SIGUSR2, and appends what it
// flipped to FILE (internal/agent/debugflip.go). Agents started through
// srun, or an --rsh that passes the environment on (the chaos suite's
// ip netns exec), inherit gorun's; ssh passes it only when SendEnv and
// the server's AcceptEnv allow it. The launcher host's agent, which runs
// inside gorun, never installs it: gorun's own SIGUSR2 is a preemption
// notice it forwards to the ranks. Unset, the agent installs nothing; no
// request on the network reaches it.
//
// A third, to measure the launch: with GORUN_DEBUG_PHASES=FILE in its
// environment, gorun writes to FILE, as it exits on its own, when the
// launch passed each of its phases (internal/phasetrace; benchlaunch's
// -phases reads it). The variable is removed from its environment at
// start, so the agents and ranks it starts do not write the file too.
package main

import (
	"fmt"
	"os"

	"github.com/gorun/gorun/internal/phasetrace"
)

func main() {
	path := os.Getenv(phasetrace.Env)
	if path == "" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	// The launcher's own phases only: not the agents' and ranks' it
	// starts (srun and the ranks would pass the variable on, and each
	// would write the file as it ends).
	os.Unsetenv(phasetrace.Env)
	phasetrace.Start()
	code := Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	if err := phasetrace.Write(path); err != nil {
		fmt.Fprintf(os.Stderr, "gorun: %s: %v\n", phasetrace.Env, err)
	}
	os.Exit(code)
}
