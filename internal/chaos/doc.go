// Package chaos is gorun's chaos suite (issue 21): it runs jobs on
// network-namespace hosts (internal/testcluster) under random
// configurations, injects one random fault per run at a random committed
// step, and judges every run against what the configuration promises
// (README.md): within the promise the job must exit 0 with the hash of a
// failure-free run of the same configuration; beyond it the job must stop
// with a report and a non-zero exit, never with a wrong hash; and every run
// must leave nothing behind.
//
// # A run
//
// Run i of seed s draws its configuration and its fault from a PCG seeded
// with (s, i) alone ([Draw]), so `make chaos SEED=s ONLY=i` replays it by
// itself. The configuration (world size, hosts, spares, ranks per host,
// --tp, --redundancy, --recovery, --protect-mode, --ckpt-dir, the
// workload and its size) is first checked with the launcher's own planning
// functions (launcher.MarkSpares, topology.MapRanks, topology.Place,
// topology.PlanEC: [Precheck]), which tell which lost hosts it survives; a
// configuration gorun refuses (exit 2 with its usage error, neither hung
// nor panicking) where the precheck said it would, for the same reason,
// is recorded as refused (its leaks and hangs still checked); a
// disagreement is a failure, and the faulty job is then not run
// (Run.NotRun, as when the failure-free run fails: judged no further,
// counted apart from injected runs). The draw does not depend on the machine: a run whose workload's
// tool (python3, mpicc.mpich) is missing is skipped. The failure-free reference of each distinct configuration is
// run once and cached by [Config.Key]; then the faulty run.
//
// Every job runs with --heartbeat-timeout 4 --hang-timeout 10 (see
// [Config.GorunFlags]) so that a lost host or a hung rank is detected in
// seconds on this machine, not after gorun's defaults.
//
// # Faults
//
// Fifteen kinds ([Kinds]): a rank's SIGKILL, a host lost (every process
// of its namespace killed), an agent's SIGKILL, a rank stopped (SIGSTOP, a
// hang), a host partitioned (its link down, up again once it was fenced),
// two hosts lost at once, a second host lost while the first is being
// recovered, SIGTERM or SIGUSR1 (forwarded to every rank) to the launcher,
// gorun's standard output stalled for 3 s (a paused pager: its pipe,
// shrunk to 4096 bytes, filled to the brim and not read; landed only if
// gorun was blocked writing to it at the release; every step line must be
// there, in order, landed or not), a byte flipped (byte 3 of the
// optimizer region: the sign and exponent of a float32, so that a silent
// restore would surely change the hash; so in the base file and the
// replicas below) in both committed ping-pong slots of a stopped rank in /dev/shm, which
// is then killed (a restore that resumes from a flipped slot's step, as
// the publish records after the fault say, must detect the CRC mismatch;
// one that resumes from another step, or from a peer's copy of a later
// commit, reads no flipped byte: that run is judged by its hash), and with the
// durable tier the whole job killed once a version is committed and
// started again with --resume (Resume), or the same with a byte flipped in
// a rank's committed base file first (CkptFlip: the resume must stop,
// naming the rank), an XID on one GPU of a host (GPUFault, gpufault.go:
// the run's job runs on package gpu's fake backend, one GPU per slot, the
// XID held back by a "when_file" of that host, which injecting creates;
// permanent XIDs, and one time in three a transient one; the failure-free
// reference runs without GPUs, whose binding must not change the hash),
// and a byte flipped in every complete replica a host holds for other
// ranks, then a host whose ranks' replicas it holds lost (ReplicaFlip,
// replicas:K in full mode only: diff mode's bases and logs and erasure
// coding's chunks are not flipped). For ReplicaFlip every job runs with
// GORUN_DEBUG_FLIP_REPLICAS naming a file in its run's directory (a
// debugging aid of the agent's, cmd/gorun's doc): the lost host is
// frozen, the holder's agent is sent SIGUSR2 and flips its replicas
// (keeper.Keeper.FlipReplicas), writing a line per flipped buffer, then the
// lost host's processes are all killed; it landed if those lines name
// every rank of the lost host the holder keeps (the agent names an owner
// whose replica a request held past its bound "busy", not flipped; no
// "done" line within 10 s is a flip that did not land either). It is within the promise
// when another holder, on neither host, keeps a copy of each of them (the
// restore refuses the flipped copy by its CRC32C and takes the good one),
// and with only flipped copies left when --ckpt-dir had a version
// committed at injection (the restore reports the copies corrupt, and the
// job rolls back to that version); otherwise, with only flipped copies
// left, beyond it: the job must stop with the CRC32C mismatch in gorun's
// standard error (replica-flip-reported), and without the durable tier
// it must not exit 0 (replica-flip-detected).
// Each is injected after a committed step read from the events file (G
// in a sample record; rank 0's step line for the MPICH workload, which
// protects nothing), never after a sleep.
//
// # The oracle
//
// [Judge] turns a [Run] into a [Verdict] by rules each citing the README
// sentence that promises it ([Rules]); TestJudge covers every rule with
// fabricated runs. A fault that was not injected (the job ended first) or
// did not land (no failure record of the faulted rank, or no failure or
// fence record of every lost host; for a stopped rank, no rank's hang
// recorded after the stop, since its peers stall in its collective and
// one of them may be named; for a stall, gorun never blocked writing)
// leaves a failure-free run, which must end as one; an injection that
// failed otherwise is a failure. SIGUSR1 must reach every rank
// (usr1-forwarded): dptrain and MPICH ranks note it and go on (every
// rank's "got SIGUSR1" line in gorun's standard error), a pytrain rank
// dies of it (a rank's exit record names it); a corrupt base detected must stop the job
// (corrupt-base-named). A GPU fault lands when gorun's standard error
// reports that GPU of that host with the XID; its class must be the one
// gpu/doc.go's table gives (gpu-fault-classified); a permanent one must be
// a failure record of what "gpu", and the host's fence and its ranks'
// splice where a spare can take them and their state survives the move,
// no fence where not (gpu-permanent-replaces); a
// transient one no failure, fence, splice or restart record at all
// (gpu-transient-reported-only). Known defects
// ([KnownDefects]), being fixed, are counted apart only for a non-zero
// exit of their fault kind and workload with their signature, and nothing
// else broken.
//
// # Leaks
//
// After every run (checkLeaks): no process left in any namespace host
// of the job, no /dev/shm entry of the job (slot files, Open MPI
// directories), no /tmp job directory, no registry entry
// (internal/jobstatus), and the launcher not outliving the last process
// of its job by more than --kill-grace + --heartbeat-timeout + 4 s (10 s)
// — a launcher that does is sent SIGQUIT, its goroutine dump kept, and the
// run fails (launcher-exits). A launcher that exits must leave no
// goroutine of gorun's behind (launcherGoroutines): every job runs with
// GORUN_DEBUG_GOROUTINES naming a file in its run's directory, where
// gorun writes its goroutine dump as it exits (cmd/gorun's doc), and a
// goroutine in it with a frame or its creator in gorun's code, other than
// the main goroutine (internal/gordump.Leftover, the rule launcher's
// TestRunGoroutines applies in-process), is a leak (no-leaks), its stack
// in the failure; so is a missing dump, unless the harness SIGKILLed the
// launcher (Resume, CkptFlip) or sent it SIGQUIT. Goroutines running
// only other modules' code that gorun's did not create, and descriptors
// the launcher leaks, are not looked for. A
// SIGKILLed agent's job directory and Open MPI directory are swept by the
// job's agents that live on (the namespace hosts share /tmp and
// /dev/shm): left, they are leaks. Where no agent of the job lives on
// (every host lost; the job Resume and CkptFlip kill whole, checked right
// after the kill, before the resumed job's agents sweep) or no host with
// ranks does and no spare took their ranks (its slot files: nobody claims
// them), README gives them to gorun clean: the built one is run, what it
// removes of the job must be among those leftovers, and the run has no
// leak only if nothing of the job is left afterwards ("removed by gorun
// clean" in the summary). MPICH's shared-memory segment files
// (/dev/shm/mpich_shar_tmp*, left by a rank killed in MPI_Init and named
// after no job) are looked for too (mpichLeaks), before gorun clean
// runs: one that appeared while the job ran (the suite's jobs run one at
// a time; those there when the job started are not its own, and are not
// judged) and that no process uses, as the agents' sweep judges
// (internal/agent.UnusedMPICHFiles), is a leak after the same grace
// period, unless every agent of the job was SIGKILLed (nobody was left
// to sweep it: gorun clean's); a line of gorun clean's removing an MPICH
// file of the job's that was not left for it is a leak too. Other leftovers not named gorun-<id> (a rank's own
// temporary files) are not looked for. A SIGKILLed launcher's registry entry is checked after the
// jobstatus.List that removes stale entries, as its doc promises.
//
// Recovery times come from the events file's timeline (detected →
// resumed); the fault → detected time compares the fault's time on the
// harness's clock with the launcher's, which starts a few milliseconds
// later: it reads short by that much (clipped at 0).
package chaos
