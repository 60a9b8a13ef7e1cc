package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gorun/gorun/internal/wire"
	"golang.org/x/sync/errgroup"
)

// startSweep starts, once, the sweep of what ended agents of any job
// left on the host (their job directories, slot files, Open MPI
// directories, MPICH segment files), off the launch's critical path: a
// /tmp may hold many names. cleanup waits for it.
func (a *agent) startSweep() {
	if a.swept != nil {
		return
	}
	done := make(chan struct{})
	a.swept = done
	shm, slots, log, hook, mp := a.shmDir(), a.slotOpt(), a.log, a.cfg.sweeping, hostMPICHSweep()
	a.tasks.Go("start's sweep", func() {
		defer close(done)
		if hook != nil {
			hook()
		}
		sweepSlots(slots, shm, mp, log)
		sweepJobDirsLog("", log)
		sweepSockDirsLog(shm, "", log)
	})
}

// start creates the job's private directory and starts this host's ranks.
func (a *agent) start(t *wire.EpochTable) error {
	if a.cfg.Host >= len(t.Hosts) {
		return fmt.Errorf("epoch table has %d hosts, this is host %d", len(t.Hosts), a.cfg.Host)
	}
	// A restart that came before the ranks started here (GPU discovery
	// took long) is over already: they start in its generation, from G.
	// A host that joins later (a spare) starts in the table's generation.
	restartG := int64(-1)
	if r := a.restart; r != nil {
		a.restart, a.gen, restartG = nil, r.Gen, r.G
	} else if t.Gen > a.gen {
		a.gen, restartG = t.Gen, t.G
	}
	if a.stopped {
		// The stop overtook the table: start nothing. The table is
		// kept, so that a later one accounts only for the ranks it
		// places here anew.
		a.startSweep()
		a.ranks = []*rankProc{}
		a.table, a.places = t, a.hostPlaces(t)
		a.notStarted(t, a.places)
		return nil
	}
	jd, err := makeJobDir(os.TempDir(), a.cfg.Job, nil)
	if err != nil {
		return err
	}
	a.jobDir, a.dir = jd, jd.path
	a.sockDir = makeSockDir(a.shmDir(), a.cfg.Job, nil, a.log)
	// Swept after the job and socket directories are held: a sweep
	// started before would find one made and not yet locked, take it
	// for an ended agent's, and this agent would make another.
	a.startSweep()
	// The ranks of a host share one temporary directory (TMPDIR): the
	// job directory itself when their sockets are in the socket
	// directory (nothing else of the agent's goes in it then: Open MPI's
	// directory is in /dev/shm too, ompiDir), else a directory "tmp"
	// beside the sockets. Directory operations are slow on some file
	// systems, on the launch's path and its end's (ext4 mounted with
	// discard, measured in a loop: mkdir 0.02 ms and rmdir 0.05 ms in the
	// median, up to 1.5 ms; inside a launch under strace 10 and 3 ms).
	tmp := jd.path
	if a.sockDir == nil {
		tmp = filepath.Join(jd.path, "tmp")
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return fmt.Errorf("creating job directory: %w", err)
		}
	}
	if d := a.spec.Dir; d != "" && !a.spec.DirExplicit {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			home, herr := os.UserHomeDir()
			if herr != nil {
				home = "/"
			}
			a.log.Warn("the launcher's working directory is missing here; ranks start in the home directory", "dir", d, "home", home)
			a.spec.Dir = home
		}
	}
	places := a.hostPlaces(t)
	a.env = glooEnv(baseEnv(os.Environ(), a.spec.Env), a.addr, ifaceOf)
	a.tmp = tmp
	a.table, a.places = t, places
	a.socks = newRankSockets(a, t, len(places))
	a.pmiKVS.setEpoch(t)
	fsub, err := a.ctl.Subscribe(a.subj.Fence, a.socks.fenceDone)
	if err != nil {
		return fmt.Errorf("subscribing to fences: %w", err)
	}
	fsub.SetPendingLimits(-1, -1)
	a.fenceSub = fsub
	// Only the first table's ranks resume from disk: a host that joins
	// later (a spare) restores its ranks from the others, as without.
	resume := a.protect.resume && a.gen == 0 && t.Epoch == 0 && len(places) > 0
	if resume {
		a.resumeT = make(chan int64, 1)
	}
	prot, err := a.startProtection(t, a.replicaLn)
	a.replicaLn = nil // protection owns it, or closed it
	if err != nil {
		return fmt.Errorf("state protection: %w", err)
	}
	a.prot = prot
	a.socks.prot = prot.host
	if a.gen > 0 {
		if err := prot.host.Restart(a.gen, restartG); err != nil {
			return fmt.Errorf("state protection: %w", err)
		}
	}
	if resume {
		// The ranks start once their states are back (resume.go).
		a.beginResume(t, places)
	} else if err := a.launch(t, places, true); err != nil {
		return err
	}
	if len(places) == 0 && !a.idle(t) {
		a.out.endGen(a.gen)
		a.event(&wire.Event{Kind: wire.EventAgentDone, Host: a.cfg.Host, Rank: -1})
	}
	if t.Hosts[a.cfg.Host].Spare {
		a.log.Info("idle spare: waiting for ranks", "epoch", t.Epoch)
	}
	a.event(&wire.Event{Kind: wire.EventEpoch, Host: a.cfg.Host, Rank: -1, Gen: a.gen, Epoch: t.Epoch})
	return nil
}

// rankSocket is rank's socket: a file in the agent's socket directory
// (or, without one, its job directory), which only the job's user may
// enter (serve checks the peer's uid as well).
func (a *agent) rankSocket(rank int) string {
	dir := a.dir
	if a.sockDir != nil {
		dir = a.sockDir.path
	}
	return filepath.Join(dir, "rank-"+strconv.Itoa(rank)+".sock")
}

// listen makes sure rank has its socket, before it starts (so that it is
// there when the rank looks); a rank placed here again keeps its own. It
// runs on launch's start goroutines, one rank each: it only reads
// a.listening, which launch updates once they have all returned, and
// reports whether the socket listens.
func (a *agent) listen(rank int) bool {
	if a.listening[rank] {
		return true
	}
	if err := a.socks.listen(rank, a.rankSocket(rank)); err != nil {
		a.log.Warn("rank socket", "rank", rank, "err", err)
		return false
	}
	return true
}

// notStarted accounts for places, ranks of this host in table t (the
// newest), of generation a.gen, that will not start because the job is
// stopping: each is reported ended, stopped, so that the launcher is not
// left waiting for them. If no rank runs here, this agent is then done
// (unless it is idle: it says nothing then); otherwise the end of the
// last rank running says so (exited).
func (a *agent) notStarted(t *wire.EpochTable, places []wire.Placement) {
	for _, pl := range places {
		a.event(&wire.Event{Kind: wire.EventExited, Host: a.cfg.Host, Rank: pl.Rank, Gen: a.gen, Stopped: true, Msg: "not started: the job is stopping"})
	}
	if a.running > 0 {
		return
	}
	a.out.endGen(a.gen)
	if !a.idle(t) {
		a.event(&wire.Event{Kind: wire.EventAgentDone, Host: a.cfg.Host, Rank: -1})
	}
}

// launch starts places, ranks of this host in table t, in restart
// generation a.gen. With all, they are all of the generation's ranks here
// (a start or a restart: every rank before them has ended); otherwise
// they join ranks that run on (ranks newly placed here in an epoch of
// the same generation: in-place recovery).
func (a *agent) launch(t *wire.EpochTable, places []wire.Placement, all bool) error {
	// Every rank's GPUs first: a host without enough fails before any
	// rank starts.
	genv := make([][]string, len(places))
	for i, pl := range places {
		var err error
		if genv[i], err = a.gpus.env(a.spec, pl); err != nil {
			return err
		}
	}
	ompiEnv, err := a.ompiEnv(t)
	if err != nil {
		return err
	}
	if all {
		a.socks.launched(a.gen)
		a.ranks = []*rankProc{} // not nil: the ranks have started
		// The previous generation's connections were closed when its
		// ranks ended (their serving goroutines close them).
		a.pmiEnds = a.pmiEnds[:0]
	}
	procs := make([]*rankProc, len(places))
	pmiMine := make([]*os.File, len(places))
	prog := lookProg(a.spec.Prog)
	for i, pl := range places {
		procs[i] = &rankProc{place: pl, gen: a.gen, prog: prog}
		if !a.spec.NoPMI {
			mine, theirs, err := pmiSocketPair()
			if err != nil {
				for _, p := range procs[:i] {
					p.pmi.Close()
				}
				for _, f := range pmiMine[:i] {
					f.Close()
				}
				return err
			}
			procs[i].pmi, pmiMine[i] = theirs, mine
		}
	}
	for _, f := range pmiMine {
		if f != nil {
			a.pmiEnds = append(a.pmiEnds, f)
		}
	}
	if a.prot != nil {
		// A new process restores anew: a note of an earlier one's
		// failed restore is not its to report.
		for _, p := range procs {
			a.prot.host.ForgetCorruptCopies(p.place.Rank)
		}
	}
	a.ranks = append(a.ranks, procs...)
	a.running += len(places)
	a.hadRanks = a.hadRanks || len(places) > 0
	// Starting a process is mostly waiting for the kernel to exec it, so
	// several starts at once overlap that latency; each start makes its
	// rank's socket first (creating a file is slow on some file systems:
	// the kernel serializes creations in one directory, but they overlap
	// the other ranks' forks).
	// What every rank's environment shares, merged once for them all.
	envb := newEnvBase(a.env)
	ompSet := hasVar(a.env, wire.EnvOMPNumThreads)
	restart := restartEnv(a.gen, a.spec.MaxRestarts)
	listened := make([]bool, len(places))
	var g errgroup.Group
	g.SetLimit(startParallel)
	for i, p := range procs {
		g.Go(func() error {
			pl := p.place
			listened[i] = a.listen(pl.Rank)
			// rankEnv(a.env, ...) merged with the rank's GPUs, the
			// generation's restart count and Open MPI's variables.
			renv := envb.merge(rankVars(a.spec, t, pl, a.rankSocket(pl.Rank), a.tmp, ompSet), genv[i], restart, ompiEnv)
			stdin := pl.Rank == a.spec.StdinRank
			err := p.start(a.spec, renv, stdin, a.out, a.exits, a.done, &a.tasks)
			if stdin {
				if p.stdin != nil {
					a.stdin.set(p.stdin)
				} else {
					a.stdin.set(nil) // not started: no pipe (a nil *os.File is not a nil io.WriteCloser)
				}
			}
			if err != nil {
				if p.pmi != nil {
					p.pmi.Close()
				}
				if f := pmiMine[i]; f != nil {
					f.Close()
				}
				a.log.Warn("cannot start rank", "rank", pl.Rank, "err", err)
				return nil
			}
			if f := pmiMine[i]; f != nil {
				a.pmiWG.Add(1)
				go a.servePMI(p, f, t.World)
			}
			a.gpus.pin(a, pl.Rank, p.pid)
			a.event(&wire.Event{Kind: wire.EventStarted, Host: a.cfg.Host, Rank: pl.Rank, Pid: p.pid, Gen: p.gen})
			return nil
		})
	}
	err = g.Wait()
	if a.listening == nil {
		a.listening = map[int]bool{}
	}
	for i, ok := range listened {
		if ok {
			a.listening[places[i].Rank] = true
		}
	}
	return err
}
