package agent

import (
	"context"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/phasetrace"
)

// lost handles the end of the launcher: stop the ranks, then return.
func (a *agent) lost(ctx context.Context) error {
	err := context.Cause(ctx)
	a.log.Warn("stopping ranks", "cause", err)
	// No rank starts from now on: a restart pending, its table here, is
	// not carried out when the last of the ranks it killed ends in the
	// drain (tryRestart reports its ranks not started).
	a.stopped = true
	a.stop(syscall.SIGTERM, a.spec.KillGrace)
	a.drain(a.spec.KillGrace + a.cfg.ExitTimeout)
	return err
}

// drain waits, at most within, for the ranks running to end, reporting
// each end (exited); a stop's SIGKILL (a.killAt), armed, is sent when it
// is due. It reports whether they all ended. It is the agent's one wait
// for its ranks at its end: after the launcher's loss (lost: a stop, then
// its grace and ExitTimeout) and in cleanup (SIGKILL, then ExitTimeout).
func (a *agent) drain(within time.Duration) bool {
	deadline := time.After(within)
	for a.running > 0 {
		select {
		case p := <-a.exits:
			a.exited(p)
		case <-a.killAt:
			a.killAt = nil
			a.signalAll(syscall.SIGKILL, true)
		case <-deadline:
			return false
		}
	}
	return true
}

// cleanup kills whatever is left of every rank's process group, waits a
// bounded time for the ranks to be reaped, and removes the job's files.
func (a *agent) cleanup() {
	// No rank starts from now on (after an exit order, a pending
	// restart's last old rank may end in the drain: tryRestart would
	// start the new generation after the SIGKILL below, and its ranks
	// would outlive the agent).
	phasetrace.Mark("agent-cleanup")
	a.stopped = true
	for _, p := range a.ranks {
		p.signal(syscall.SIGKILL) // ranks still running (an ended rank's group was killed when it ended)
	}
	a.killAt = nil // killed already: a stop's SIGKILL has nothing left to do
	if !a.drain(a.cfg.ExitTimeout) {
		for _, p := range a.ranks {
			if !p.ended {
				a.log.Error("rank did not end after SIGKILL; leaving it", "rank", p.place.Rank, "pid", p.pid)
			}
		}
	}
	live := map[int]bool{}
	for _, p := range a.ranks {
		if !p.ended {
			live[p.pid] = true
		}
	}
	phasetrace.Mark("agent-drained")
	killOrphans(a.cfg.Job, live, time.Now().Add(a.cfg.ExitTimeout), a.log)
	phasetrace.Mark("agent-orphans")
	a.stdin.close()
	if a.fenceSub != nil {
		_ = a.fenceSub.Unsubscribe()
	}
	if a.socks != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a.socks.close(ctx)
		cancel()
	}
	for _, f := range a.pmiEnds {
		f.Close() // ends the PMI connections still served
	}
	a.pmiWG.Wait()
	a.stopResume() // its goroutines use the protection
	a.stopRollback()
	if a.prot != nil {
		a.prot.close()
	}
	if a.out != nil {
		a.out.Close()
	}
	phasetrace.Mark("agent-closed")
	a.ompi.removeDir(a)
	if err := a.jobDir.remove(); err != nil {
		a.log.Warn("cannot remove job directory", "err", err)
	}
	if err := a.sockDir.remove(); err != nil {
		a.log.Warn("cannot remove socket directory", "err", err)
	}
	// Agents of this job killed on this host (or another sharing its
	// file systems: network namespaces) left their directories.
	phasetrace.Mark("agent-jobdir")
	if a.swept != nil {
		<-a.swept
	}
	phasetrace.Mark("agent-swept")
	sweepJobDirsLog(a.cfg.Job, a.log)
	sweepSockDirsLog(a.shmDir(), a.cfg.Job, a.log)
	sweepJobSlots(a.slotOpt(), a.cfg.Job, a.log)

	phasetrace.Mark("agent-sweep-job")
	if a.ctl != nil {
		_ = a.ctl.FlushTimeout(2 * time.Second)
	}
	phasetrace.Mark("agent-flushed")
	// Last, so that the job's own files and the flush never wait on it
	// (it may wait up to mpichMinAge): the job's Open MPI directories,
	// and, the ranks being gone, MPICH segment files one of them left
	// (killed in MPI_Init), used by nobody now.
	sweepShmLog(a.shmDir(), a.cfg.Job, hostMPICHSweep(), true, a.log)
	phasetrace.Mark("agent-shm")
}
