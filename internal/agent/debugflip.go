package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// debugFlipEnv names the debugging aid the chaos suite's replica-flip
// fault uses (internal/chaos): an agent started as its own process
// (`gorun agent`) with GORUN_DEBUG_FLIP_REPLICAS=FILE in its environment
// flips one byte of every complete replica its host holds for other
// ranks' (keeper.Keeper.FlipReplicas) each time it gets SIGUSR2, and appends
// one line per flipped buffer to FILE, then a line "done HOST N". An
// owner whose replica a request holds past debugFlipWait is left as it
// is and named in a line "busy HOST OWNER". Unset, the agent installs
// nothing: no handler, no goroutine (SIGUSR2 then kills it, as any
// process). The launcher host's agent, which runs inside gorun, never
// installs it: gorun's own SIGUSR2 (a preemption notice it forwards to
// the ranks) is not for it. Nothing on the network reaches it.
const debugFlipEnv = "GORUN_DEBUG_FLIP_REPLICAS"

// debugFlipWait bounds one flip's wait for the owners' replicas that
// requests in progress hold (a put from a frozen host, a get to one).
const debugFlipWait = 2 * time.Second

// startDebugFlip starts the GORUN_DEBUG_FLIP_REPLICAS hook's goroutine
// when the variable is set and the agent is not the launcher's
// in-process one (Config.Dial set); it ends when p.stop is closed (a
// flip under way stops waiting then), and p.close waits for it
// (p.flipDone) before it closes the host.
func (p *protection) startDebugFlip() {
	file := os.Getenv(debugFlipEnv)
	if file == "" || p.a.cfg.Dial != nil {
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR2)
	p.flipDone = make(chan struct{})
	p.a.tasks.Go("debug flip hook", func() {
		defer close(p.flipDone)
		defer signal.Stop(sigs)
		for {
			select {
			case <-p.stop:
				return
			case <-sigs:
				if err := p.flipUntilStop(file); err != nil {
					p.a.log.Debug("debug hook: flipping the replicas held here", "env", debugFlipEnv, "err", err)
				}
			}
		}
	})
}

// flipUntilStop is flipReplicas bounded by debugFlipWait and by p.stop.
func (p *protection) flipUntilStop(file string) error {
	ctx, cancel := context.WithTimeout(context.Background(), debugFlipWait)
	wg := newSubgroup(&p.a.tasks, "debug flip stop watch")
	wg.Go(func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	})
	err := p.flipReplicas(ctx, file)
	cancel()
	wg.Wait()
	return err
}

// flipReplicas flips the replicas held here and appends what it flipped
// to file: "flipped HOST OWNER STEP REGION" per buffer, "busy HOST OWNER"
// per owner whose replica a request held until ctx ended, then "done
// HOST N" (N buffers flipped), or "refused HOST: WHY" when the host's
// mode keeps no whole buffers.
func (p *protection) flipReplicas(ctx context.Context, file string) error {
	host := p.a.cfg.Host
	flipped, busy, ferr := p.host.FlipReplicas(ctx)
	var b strings.Builder
	for _, f := range flipped {
		p.a.log.Debug("debug hook: flipped a replica held here", "env", debugFlipEnv, "owner", f.Owner, "step", f.Step, "region", f.Region)
		fmt.Fprintf(&b, "flipped %d %d %d %s\n", host, f.Owner, f.Step, f.Region)
	}
	for _, r := range busy {
		p.a.log.Debug("debug hook: a request holds a replica held here; not flipped", "env", debugFlipEnv, "owner", r)
		fmt.Fprintf(&b, "busy %d %d\n", host, r)
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
