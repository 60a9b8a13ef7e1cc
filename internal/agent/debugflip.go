package agent

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// debugFlipEnv names the debugging aid the chaos suite's replica-flip
// fault uses (internal/chaos): an agent with GORUN_DEBUG_FLIP_REPLICAS=FILE
// in its environment (it inherits gorun's) flips one byte of every
// complete replica its host holds for other ranks' (rank.Host.FlipReplicas)
// each time it gets SIGUSR2, and appends one line per flipped buffer to
// FILE, then a line "done HOST N". Unset, the agent installs nothing: no
// handler, no goroutine (SIGUSR2 then kills it, as any process). Nothing
// on the network reaches it.
const debugFlipEnv = "GORUN_DEBUG_FLIP_REPLICAS"

// startDebugFlip starts the GORUN_DEBUG_FLIP_REPLICAS hook's goroutine
// when the variable is set; it ends when p.stop is closed, and p.close
// waits for it (p.flipDone) before it closes the host.
func (p *protection) startDebugFlip() {
	file := os.Getenv(debugFlipEnv)
	if file == "" {
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR2)
	p.flipDone = make(chan struct{})
	go func() {
		defer close(p.flipDone)
		defer signal.Stop(sigs)
		for {
			select {
			case <-p.stop:
				return
			case <-sigs:
				if err := p.flipReplicas(file); err != nil {
					p.a.log.Debug("debug hook: flipping the replicas held here", "env", debugFlipEnv, "err", err)
				}
			}
		}
	}()
}

// flipReplicas flips the replicas held here and appends what it flipped
// to file: "flipped HOST OWNER STEP REGION" per buffer, then "done HOST N"
// (N buffers), or "refused HOST: WHY" when the host's mode keeps no whole
// buffers.
func (p *protection) flipReplicas(file string) error {
	host := p.a.cfg.Host
	flipped, ferr := p.host.FlipReplicas()
	var b strings.Builder
	for _, f := range flipped {
		p.a.log.Debug("debug hook: flipped a replica held here", "env", debugFlipEnv, "owner", f.Owner, "step", f.Step, "region", f.Region)
		fmt.Fprintf(&b, "flipped %d %d %d %s\n", host, f.Owner, f.Step, f.Region)
	}
	if ferr != nil {
		fmt.Fprintf(&b, "refused %d: %v\n", host, ferr)
	} else {
		fmt.Fprintf(&b, "done %d %d\n", host, len(flipped))
	}
	fh, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return errors.Join(ferr, fmt.Errorf("agent: %s: %w", debugFlipEnv, err))
	}
	_, werr := fh.WriteString(b.String()) // one write: lines of agents appending at once do not interleave
	cerr := fh.Close()
	return errors.Join(ferr, werr, cerr)
}
