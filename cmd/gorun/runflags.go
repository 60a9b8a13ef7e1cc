package main

import "github.com/gorun/gorun/protect"

// The flags of `gorun [run]`: runFlags is their one description, from
// which parseRun registers them and runUsage makes the usage; README's flag
// table is checked against it (readme_test.go).

// runFlagArgs are the flags parseRun reads itself rather than into
// runOptions.
type runFlagArgs struct {
	redundancy  string
	protectMode string
	help        bool
	version     bool
}

// The usage's sections, in order.
const (
	groupPlacement = "Placement"
	groupFault     = "Fault tolerance"
	groupDurable   = "Durable checkpoints (the whole job lost: gorun --resume)"
	groupMPI       = "MPI programs"
	groupEnv       = "Environment"
	groupIO        = "Input and output"
	groupControl   = "Control"
)

var runGroups = []flagGroup{
	{title: groupPlacement, note: "(no hostfile or -H: this host, with one slot per GPU, or per CPU without GPUs)"},
	{title: groupFault},
	{title: groupDurable},
	{title: groupMPI},
	{title: groupEnv},
	{title: groupIO},
	{title: groupControl},
}

// runFlags describes gorun's flags, bound to o and a, in the usage's order.
func runFlags(o *runOptions, a *runFlagArgs) []flagSpec {
	specs := []flagSpec{
		{names: []string{"-np", "-n"}, arg: "N", group: groupPlacement, define: intFlag(&o.np, 0),
			help: "number of ranks (default: every slot)"},
		{names: []string{"--hostfile", "-f", "--machinefile"}, arg: "FILE", group: groupPlacement, define: strFlag(&o.hostfile, ""),
			help: `hosts, Open MPI (node slots=4) or MPICH (node:4) form;
Slurm lists node[01-04] expand; rack=, switch=, spare`},
		{names: []string{"-H", "--host"}, arg: "LIST", group: groupPlacement, define: strFlag(&o.hostList, ""),
			help: "hosts inline: h1:2,h2,node[1-3]:4"},
		{names: []string{"--map-by"}, arg: "slot|node", group: groupPlacement, define: strFlag(&o.mapBy, "slot"),
			help: "fill each host's slots first, or round-robin (default slot)"},
		{names: []string{"--oversubscribe"}, group: groupPlacement, define: boolFlag(&o.oversubscribe, false),
			help: "allow more ranks than slots"},
		{names: []string{"--tp"}, arg: "N", group: groupPlacement, define: intFlag(&o.tp, 1),
			help: `tensor-parallel size (default 1), in Megatron rank
order; -np must be a multiple of tp × pp. Ranks get
GORUN_TP_SIZE, GORUN_PP_SIZE and GORUN_DP_SIZE`},
		{names: []string{"--pp"}, arg: "N", group: groupPlacement, define: intFlag(&o.pp, 1),
			help: "pipeline-parallel size (default 1), as --tp"},
		{names: []string{"--gpus-per-rank"}, arg: "G", group: groupPlacement, define: intFlag(&o.gpusPerRank, 0),
			help: `GPUs per rank on hosts with GPUs (default: one each,
shared round-robin when ranks outnumber them); ranks
get CUDA_VISIBLE_DEVICES and CPUs near their GPUs`},

		{names: []string{"--redundancy"}, arg: "replicas:K|ec:K+M", group: groupFault, define: strFlag(&a.redundancy, ""),
			help: `how each rank's protected state survives lost hosts:
replicas:K, whole copies on K other hosts of its
data-parallel group (default replicas:1 where the hosts
allow it; asked for explicitly, it must be met); ec:K+M,
an erasure code over groups of K data and M parity
hosts (across racks when the hostfile names them):
any M hosts of a group may be lost, at (K+M)/K times
the state's memory instead of K+1 times. The hosts
with ranks must form whole groups and each group's
ranks must divide by K; -v says what the job survives.
With --protect-mode diff only the bases are coded
and M is at most 16`},
		{names: []string{"--replicas"}, arg: "K", group: groupFault, define: intFlag(&o.replicas, 1),
			help: "the same as --redundancy replicas:K (0 to 8; default 1)"},
		{names: []string{"--protect-mode"}, arg: "full|diff", group: groupFault, define: strFlag(&a.protectMode, string(protect.ModeFull)),
			help: `full: every step's protected state is copied whole to
its holders (any trainer); diff: only each step's
gradient and hyper-parameters, with a base every
--base-every steps; holders rebuild the state by replay
(trainers that declare the replay optimizer, e.g.
examples/dptrain). Default full`},
		{names: []string{"--diff-fold"}, arg: "N", group: groupFault, define: intFlag(&o.diff.Fold, defaultDiffFold),
			help: `diff: holders fold the log into the base every N steps
(1 to 4096, default 8); a holder holds about
(2 + N/3) x each owner's optimizer state with the raw
codec (full mode: 2x). Under --redundancy ec nothing
folds (base refreshes take the place of folds)`},
		{names: []string{"--base-every"}, arg: "B", group: groupFault, define: intFlag(&o.diff.BaseEvery, defaultBaseEvery),
			help: `diff: a fresh base every B steps, sent in paced chunks
(1 to 2^31, default 100); under --redundancy ec only
the bases are coded and each log holder keeps up to
about B steps per rank (warned above 4 x --diff-fold)`},
		{names: []string{"--diff-codec"}, arg: "raw|int8[:B]|topk:K", group: groupFault, define: strFlag(&o.diff.Codec, defaultDiffCodec),
			help: `diff: how gradients are encoded; raw (default) is
lossless and restores bitwise, int8 (blocks of B
elements, default 256) and topk (the fraction K of the
largest entries, 0 < K <= 1) are lossy`},
		{names: []string{"--max-restarts"}, arg: "N", group: groupFault, define: intFlag(&o.maxRestarts, 0),
			help: `restart every rank in place up to N times after a rank
fails, resuming from the step every rank can recover
(default 0: a failure ends the job)`},
		{names: []string{"--spares"}, arg: "K", group: groupFault, define: intFlag(&o.spares, 0),
			help: `hold the last K hosts back as spares (as the hostfile's
spare keyword does): their agents start with the job and
a spare replaces a lost host, which the job survives`},
		{names: []string{"--on-no-spare"}, arg: "free-slots|abort", group: groupFault, define: strFlag(&o.onNoSpare, "free-slots"),
			help: `a host lost with no spare left: move its ranks to hosts
with free slots (default free-slots), or stop the job`},
		{names: []string{"--recovery"}, arg: "restart|in-place", group: groupFault, define: strFlag(&o.recovery, "restart"),
			help: `after a host is replaced, restart every rank from the
recoverable step (default restart), or keep the survivors
running (programs using gorun's rank client only)`},
		{names: []string{"--suspect-timeout"}, arg: "S", group: groupFault, define: secondsFlag(&o.suspect, defaultSuspect),
			help: `a host suspected (control connection dropped, replication
to it failed, a peer lost there) is lost unless heard from
within S seconds (default 1)`},
		{names: []string{"--hang-timeout"}, arg: "S", group: groupFault, define: secondsFlag(&o.hang, 0),
			help: `a rank that reported progress and then none for S seconds
has hung (default 0: off)`},
		{names: []string{"--events"}, arg: "FILE", group: groupFault, define: strFlag(&o.events, ""),
			help: `write the job's record (launch, samples, failures,
recoveries, exit) as JSON lines to FILE; gorun report
FILE makes a page of it`},
		{names: []string{"--metrics"}, arg: "ADDR", group: groupFault, define: strFlag(&o.metrics, ""),
			help: `serve Prometheus metrics at http://ADDR/metrics (":9400":
loopback; port 0 picks one, shown by gorun status and -v)`},
	}
	specs = append(specs, o.durableFlags()...)
	return append(specs, []flagSpec{
		{names: []string{"--pmi"}, arg: "[=false]", group: groupMPI, define: boolFlag(&o.pmi, true),
			help: `serve the PMI-1 protocol to every rank (PMI_FD, as Hydra
does), so that MPICH-built programs start under gorun
as under mpiexec (default true)`},
		{names: []string{"--mpi"}, arg: "auto|openmpi|mpich", group: groupMPI, define: strFlag(&o.mpi, "auto"),
			help: `the MPI the program is built with (default auto: the
libmpi it links); Open MPI 4 ranks also get its flux
bootstrap over gorun's PMI-1 client library`},

		{names: []string{"-x"}, arg: "VAR[=value]", group: groupEnv, define: listFlag(&o.exports),
			help: `export VAR from gorun's environment to every rank, or
set it to value (repeatable)`},
		{names: []string{"--wdir"}, arg: "DIR", group: groupEnv, define: strFlag(&o.wdir, ""),
			help: "working directory of the ranks (default: the current one)"},

		{names: []string{"--stdin"}, arg: "RANK|none", group: groupIO, define: strFlag(&o.stdin, "0"),
			help: `which rank reads gorun's standard input (default 0;
the others read /dev/null)`},
		{names: []string{"--tag-output"}, arg: "[=false]", group: groupIO, define: boolFlag(&o.tagOutput, true),
			help: "prefix every line with [rank] (default true)"},
		{names: []string{"--timestamp-output"}, group: groupIO, define: boolFlag(&o.timestamp, false),
			help: "prefix every line with the time"},
		{names: []string{"--output-filename"}, arg: "DIR", group: groupIO, define: strFlag(&o.outputDir, ""),
			help: "write DIR/rank.N/stdout and stderr instead of the terminal"},

		{names: []string{"--timeout"}, arg: "SECONDS", group: groupControl, define: secondsFlag(&o.timeout, 0),
			help: "stop the job after this long (exit code 124)"},
		{names: []string{"--kill-grace"}, arg: "SECONDS", group: groupControl, define: secondsFlag(&o.killGrace, defaultKillGrace),
			help: "time between SIGTERM and SIGKILL when stopping (default 10)"},
		{names: []string{"--rsh"}, arg: "CMD", group: groupControl, define: strFlag(&o.rsh, "ssh"),
			help: `how agents start on remote hosts (default "ssh";
e.g. "ip netns exec"); the local host needs none`},
		{names: []string{"--launch-agent"}, arg: "PATH", group: groupControl, define: strFlag(&o.launchAgent, ""),
			help: "gorun binary on remote hosts (default: this one's path)"},
		{names: []string{"--rsh-concurrent"}, arg: "N", group: groupControl, define: intFlag(&o.rshConcurrent, 128),
			help: "agents being started at once (default 128)"},
		{names: []string{"--bind"}, arg: "ADDR", group: groupControl, define: strFlag(&o.bind, ""),
			help: `control-plane address (default: 127.0.0.1 when every
host is this one, else the address routing to the hosts)`},
		{names: []string{"--launcher"}, arg: "auto|ssh|slurm|local", group: groupControl, define: strFlag(&o.launcher, "auto"),
			help: `how agents start on the other hosts (default auto:
srun inside a Slurm allocation given no hosts, else --rsh)`},
		{names: []string{"--agent-start-timeout"}, arg: "S", group: groupControl, define: secondsFlag(&o.startTimeout, 0),
			help: `an agent must register this soon after it is started
(default 60)`},
		{names: []string{"--heartbeat-interval"}, arg: "S", group: groupControl, define: secondsFlag(&o.hbInterval, defaultHeartbeat),
			help: "agent heartbeat interval (default 1)"},
		{names: []string{"--heartbeat-timeout"}, arg: "S", group: groupControl, define: secondsFlag(&o.hbTimeout, 0),
			help: "a host is lost after this long without one (default 10)"},
		{names: []string{"-v", "--verbose"}, group: groupControl, define: boolFlag(&o.verbose, false),
			help: "say what gorun does"},
		{names: []string{"--version"}, group: groupControl, define: boolFlag(&a.version, false),
			help: "print the version"},
		{names: []string{"-h", "--help"}, group: groupControl, define: boolFlag(&a.help, false),
			help: "this text"},
	}...)
}

const usageHead = `Usage: gorun [flags] [--] PROG [ARGS...]

Starts copies (ranks) of PROG across hosts, mpirun style, and returns the
exit code of the rank that failed first (0 when all succeed).

`

const usageTail = `
Signals: SIGINT, SIGTERM and SIGHUP stop every rank (the same signal, then
SIGKILL after the grace period; a second one kills at once); SIGUSR1 and
SIGUSR2 are forwarded to every rank. Every rank gets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, OMPI_COMM_WORLD_* and GORUN_* variables.

gorun ckpt ls|show|verify DIR inspects a checkpoint directory.
gorun report EVENTS [-o FILE] makes an HTML page of an --events file.
gorun plan [flags] says what failures will cost a job before it runs (gorun plan -h).
gorun status [JOB] [--json] [--watch] shows a running job (gorun status -h).
gorun clean [-n] removes what your ended jobs left on this host (gorun clean -h).
`

// usageColumn is where the help texts of gorun's usage start.
const usageColumn = 26

// runUsage is `gorun --help`, made from runFlags (when asked for: not
// at every start, where it cost 0.15 ms of the launch).
func runUsage() string {
	return flagUsage(usageHead, runFlags(&runOptions{}, &runFlagArgs{}), runGroups, usageColumn, "\n", usageTail)
}
