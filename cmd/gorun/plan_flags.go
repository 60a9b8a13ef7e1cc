package main

// The flags of gorun plan: planFlagSpecs is their one description, from
// which planFromArgs registers them and planUsage is made.

// The sections of gorun plan's usage.
const (
	planFailures   = "Failures (one of)"
	planJob        = "Job"
	planBandwidths = "Bandwidths (measured when it can, else given, else a default)"
	planRecovery   = "Recovery"
	planDurable    = "Durable tier"
	planOutputs    = "Output"
)

var planGroups = []flagGroup{{title: planFailures}, {title: planJob}, {title: planBandwidths}, {title: planRecovery}, {title: planDurable}, {title: planOutputs}}

// planUsage is `gorun plan -h`, its flags from planFlagSpecs.
func planUsage() string {
	return flagUsage(planUsageHead, planFlagSpecs(&planFlagVals{}), planGroups, 26, "", planUsageTail)
}

// planFlagVals are gorun plan's flags as given: strings and counts that
// planParser reads (an int flag not given is -1, a string "").
type planFlagVals struct {
	str    map[string]*string
	ints   map[string]*int
	seed   uint64
	asJSON bool
}

// planFlagSpecs describes gorun plan's flags, bound to v (whose maps it
// fills).
func planFlagSpecs(v *planFlagVals) []flagSpec {
	v.str, v.ints = map[string]*string{}, map[string]*int{}
	str := func(name string) defineFunc {
		v.str[name] = new(string)
		return strFlag(v.str[name], "")
	}
	count := func(name string) defineFunc {
		v.ints[name] = new(int)
		return intFlag(v.ints[name], -1)
	}
	return []flagSpec{
		{names: []string{"--mttf"}, arg: "DUR", group: planFailures, define: str("mttf"),
			help: "one host's mean time to failure (e.g. 8760h, 365d)"},
		{names: []string{"--trace"}, arg: "FILE", group: planFailures, define: str("trace"),
			help: `failure trace: one TIME[,HOST[,...]] per line, TIME
since the job started in seconds or as a duration,
or an RFC 3339 timestamp; '#' comments, a header
line and further columns are skipped. MTTF is then
job-length x hosts / failures`},
		{names: []string{"--trace-start"}, arg: "TIME", group: planFailures, define: str("trace-start"),
			help: `the timestamps count from TIME (RFC 3339; default
the trace's first failure)`},

		{names: []string{"--hosts"}, arg: "N", group: planJob, define: count("hosts"),
			help: "hosts running ranks (or --hostfile)"},
		{names: []string{"--hostfile"}, arg: "FILE", group: planJob, define: str("hostfile"),
			help: `gorun's hostfile: its hosts not marked spare run ranks,
its spare hosts count as --spares`},
		{names: []string{"--ranks-per-host"}, arg: "N", group: planJob, define: count("ranks-per-host"),
			help: "ranks on each host (default 1)"},
		{names: []string{"--step"}, arg: "DUR", group: planJob, define: str("step"),
			help: "time of one training step (required)"},
		{names: []string{"--state"}, arg: "SIZE", group: planJob, define: str("state"),
			help: "protected state of one rank, e.g. 4GiB (required)"},
		{names: []string{"--job-length"}, arg: "DUR", group: planJob, define: str("job-length"),
			help: `failure-free length of the job (required without
--trace; with one, default its last failure, which
biases the MTTF low: give the trace's real span)`},

		{names: []string{"--mem-bw"}, arg: "BW", group: planBandwidths, define: str("mem-bw"),
			help: "local memory copy (default: measured here)"},
		{names: []string{"--net-bw"}, arg: "BW", group: planBandwidths, define: str("net-bw"),
			help: `between two hosts (default: measured between the
first two hosts of --hostfile by a 2-rank gorun job
sending --measure-size bytes; without a hostfile,
1.25GB/s, 10 Gbit/s)`},
		{names: []string{"--durable-bw"}, arg: "BW", group: planBandwidths, define: str("durable-bw"),
			help: `durable storage, as one host sees it while every
host writes (its share; default 1GB/s)`},
		{names: []string{"--durable-bw-total"}, arg: "BW", group: planBandwidths, define: str("durable-bw-total"),
			help: `or the storage's aggregate bandwidth, shared by
every host: each host's share is BW / hosts`},
		{names: []string{"--durable-dir"}, arg: "DIR", group: planBandwidths, define: str("durable-dir"),
			help: `or measure it: write and fsync --measure-size bytes
in DIR, then remove the file (one host alone: an
upper bound of its share while every host writes)`},
		{names: []string{"--measure-size"}, arg: "SIZE", group: planBandwidths, define: str("measure-size"),
			help: "bytes written or sent to measure (default 256MiB)"},
		{names: []string{"--rsh"}, arg: "CMD", group: planBandwidths, define: str("rsh"),
			help: "as gorun's, for the network measurement job"},
		{names: []string{"--bind"}, arg: "ADDR", group: planBandwidths, define: str("bind"),
			help: "as gorun's, for the network measurement job"},

		{names: []string{"--restart"}, arg: "DUR", group: planRecovery, define: str("restart"),
			help: `checkpoint-restart's stall before restoring: stop,
get a host, start every rank (default 10m)`},
		{names: []string{"--replace"}, arg: "DUR", group: planRecovery, define: str("replace"),
			help: `gorun's replacement before the state transfer:
detect, attach a spare, rendezvous (default 30s)`},
		{names: []string{"--redundancy"}, arg: "replicas:K|ec:K+M", group: planRecovery, define: str("redundancy"),
			help: "as gorun's (default replicas:1 where the hosts allow it)"},
		{names: []string{"--spares"}, arg: "N", group: planRecovery, define: count("spares"),
			help: "spare hosts (default 0, or the hostfile's)"},
		{names: []string{"--spare-risk"}, arg: "P", group: planRecovery, define: str("spare-risk"),
			help: `spares are recommended so that running out is less
likely than P (default 0.01)`},

		{names: []string{"--interval"}, arg: "K", group: planDurable, define: count("interval"),
			help: `steps between durable checkpoints, as gorun's
--ckpt-every (default: PCcheck's f* for the inputs)`},
		{names: []string{"--ckpt-concurrency"}, arg: "N", group: planDurable, define: count("ckpt-concurrency"),
			help: "checkpoints in flight, 1 to 8 as gorun's (default 1)"},
		{names: []string{"--ckpt-overhead"}, arg: "Q", group: planDurable, define: str("ckpt-overhead"),
			help: `the fraction of time checkpointing may cost, PCcheck's
q = 1 + Q (default 0.03)`},

		{names: []string{"--runs"}, arg: "N", group: planOutputs, define: count("runs"),
			help: "Monte Carlo runs, at most 1000000 (default 1000)"},
		{names: []string{"--seed"}, arg: "N", group: planOutputs, define: uint64Flag(&v.seed, 1),
			help: `Monte Carlo seed: the same seed gives the same figures
(default 1)`},
		{names: []string{"--json"}, group: planOutputs, define: boolFlag(&v.asJSON, false),
			help: "one JSON object instead of the report"},
	}
}
