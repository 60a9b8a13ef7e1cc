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
// configuration gorun refuses (exit 2) is recorded as refused, never as a
// failure. The failure-free reference of each distinct configuration is
// run once and cached by [Config.Key]; then the faulty run.
//
// Every job runs with --heartbeat-timeout 4 --hang-timeout 10 (see
// [Config.GorunFlags]) so that a lost host or a hung rank is detected in
// seconds on this machine, not after gorun's defaults.
//
// # Faults
//
// Thirteen kinds ([Kinds]): a rank's SIGKILL, a host lost (every process
// of its namespace killed), an agent's SIGKILL, a rank stopped (SIGSTOP, a
// hang), a host partitioned (its link down, up again once it was fenced),
// two hosts lost at once, a second host lost while the first is being
// recovered, SIGTERM or SIGUSR1 (forwarded to every rank) to the launcher,
// gorun's standard output stalled for 3 s (a paused pager), a byte flipped
// in both committed ping-pong slots of a stopped rank in /dev/shm, which
// is then killed (its restore must detect the CRC mismatch), and with the
// durable tier the whole job killed once a version is committed and
// started again with --resume (Resume), or the same with a byte flipped in
// a rank's committed base file first (CkptFlip: the resume must stop,
// naming the rank). Each is injected after a committed step read from the
// events file (G in a sample record; rank 0's step line for the MPICH
// workload, which protects nothing), never after a sleep.
//
// # The oracle
//
// [Judge] turns a [Run] into a [Verdict] by rules each citing the README
// sentence that promises it ([Rules]); TestJudge covers every rule with
// fabricated runs.
//
// # Leaks
//
// After every run (checkLeaks): no process left in any namespace host
// of the job, no /dev/shm entry of the job (slot files, Open MPI
// directories), no /tmp job directory, no registry entry
// (internal/jobstatus), and the launcher not outliving the last process
// of its job by more than 30 s — a launcher that does is sent SIGQUIT, its
// goroutine dump kept, and the run counts a leak: that is the launcher's
// goroutine-leak check (a goroutine that keeps the launcher from exiting
// is the leak that matters to a user). An agent SIGKILLed (a host lost,
// its agent killed, the whole job killed) cannot remove its /tmp job
// directory nor its Open MPI directory in /dev/shm: until the sweep of
// them merges, exactly those, of the crashed hosts, are counted apart as
// known leaks ([KnownAgentDirLeak], [KnownAgentShmLeak]), never as zero.
// A SIGKILLed launcher's registry entry is checked after the
// jobstatus.List that removes stale entries, as its doc promises.
//
// Recovery times come from the events file's timeline (detected →
// resumed); the fault → detected time compares the fault's time on the
// harness's clock with the launcher's, which starts a few milliseconds
// later: it reads short by that much (clipped at 0).
package chaos
