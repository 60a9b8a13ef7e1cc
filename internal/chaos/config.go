package chaos

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Workloads a configuration runs.
const (
	Dptrain = "dptrain" // examples/dptrain: Go, in-place recovery, final params and optimizer hashes
	Pytrain = "pytrain" // examples/pytrain: Python stdlib client, restart recovery, final hash
	MPICH   = "mpich"   // testdata/mpisteps.c built with mpicc.mpich: no protected state, restart from the start
)

// MaxHosts is how many namespace hosts the suite builds once and every
// configuration takes its hosts from (work hosts first, then spares).
const MaxHosts = 6

// The jobs' --kill-grace and --heartbeat-timeout: the launcher's
// give-up deadline after its job's processes are gone is their sum
// (outliveLimit).
const (
	killGrace        = 2 * time.Second
	heartbeatTimeout = 4 * time.Second
)

// Config is one job's configuration: everything that decides its final
// hash and what it survives. The zero Config is not valid; [Draw] makes
// them.
type Config struct {
	Workload     string
	Hosts        int    // hosts running ranks
	Spares       int    // spare hosts after them (--spares)
	RanksPerHost int    // slots of every host (the hostfile's slots=)
	TP           int    // --tp (1: none)
	PP           int    // --pp (1: none)
	Redundancy   string // --redundancy: replicas:K or ec:K+M
	Recovery     string // --recovery: restart or in-place
	Protect      string // --protect-mode: full or diff
	Durable      bool   // --ckpt-dir (a fresh directory per job) --ckpt-every 5
	Params       string // dptrain --params
	Steps        int
	DeviceMs     int // dptrain --device-ms: emulated accelerator time per step
	Seed         uint64
}

// NP is the job's world size: every slot of the work hosts.
func (c Config) NP() int { return c.Hosts * c.RanksPerHost }

// Key identifies the configuration for the reference cache: two runs of
// equal keys must end with equal hashes when nothing fails.
func (c Config) Key() string {
	return fmt.Sprintf("%s/h%d+%d/r%d/tp%dpp%d/%s/%s/%s/durable=%v/%s/s%d/d%d/seed%d",
		c.Workload, c.Hosts, c.Spares, c.RanksPerHost, c.TP, c.PP, c.Redundancy, c.Recovery, c.Protect,
		c.Durable, c.Params, c.Steps, c.DeviceMs, c.Seed)
}

func (c Config) String() string { return c.Key() }

// GorunFlags are gorun's flags for c (before "--"), with the hostfile,
// the control plane's address, the events file and the durable
// directory ("" without --ckpt-dir).
func (c Config) GorunFlags(hostfile, bind, events, ckptDir string) []string {
	f := []string{"-np", strconv.Itoa(c.NP()), "--hostfile", hostfile, "--rsh", "ip netns exec", "--bind", bind,
		"-v", "--events", events, "--kill-grace", strconv.Itoa(int(killGrace / time.Second)), "--max-restarts", "3",
		// Detection in seconds on this machine: gorun's defaults (10 missed
		// beats of 1 s, no hang detection) would make every host fault
		// cost 10 s and a stopped rank hang the job for ever.
		"--heartbeat-timeout", strconv.Itoa(int(heartbeatTimeout / time.Second)), "--hang-timeout", "10",
		"--redundancy", c.Redundancy, "--recovery", c.Recovery, "--protect-mode", c.Protect}
	if c.Spares > 0 {
		f = append(f, "--spares", strconv.Itoa(c.Spares))
	}
	if c.TP > 1 {
		f = append(f, "--tp", strconv.Itoa(c.TP))
	}
	if c.PP > 1 {
		f = append(f, "--pp", strconv.Itoa(c.PP))
	}
	if c.Protect == "diff" {
		f = append(f, "--base-every", "10")
	}
	if ckptDir != "" {
		f = append(f, "--ckpt-dir", ckptDir, "--ckpt-every", "5")
	}
	return f
}

// Program is the command line of the ranks (after "--"), given the
// binaries.
func (c Config) Program(b Binaries) []string {
	switch c.Workload {
	case Pytrain:
		return []string{b.Python, b.Pytrain, "--protect", "--steps", strconv.Itoa(c.Steps), "--seed", strconv.FormatUint(c.Seed, 10)}
	case MPICH:
		return []string{b.MPI, strconv.Itoa(c.Steps), strconv.Itoa(c.DeviceMs)}
	default:
		return []string{b.Dptrain, "--protect", "--params", c.Params, "--steps", strconv.Itoa(c.Steps),
			"--seed", strconv.FormatUint(c.Seed, 10), "--batch", "48", "--log-every", "1", "--device-ms", strconv.Itoa(c.DeviceMs)}
	}
}

// Binaries are the programs the jobs run.
type Binaries struct {
	Gorun, Dptrain  string
	Python, Pytrain string // "" when python3 is missing: pytrain runs are skipped
	MPI             string // testdata/mpisteps.c built with mpicc.mpich, "" without it: MPICH runs are skipped
}

// missing says why a run of workload cannot run here, "" when it can.
// Draws do not depend on it (the same seed draws the same runs on every
// machine); the runs it names are skipped.
func (b Binaries) missing(workload string) string {
	switch {
	case workload == Pytrain && b.Python == "":
		return "no python3: the pytrain workload cannot run"
	case workload == MPICH && b.MPI == "":
		return "no mpicc.mpich: the MPICH workload cannot run"
	}
	return ""
}

// pick returns one of xs, uniformly.
func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// drawConfig draws a configuration. Most are valid: a draw the precheck
// refuses is drawn again (from the same stream), but one time in ten it
// is kept, and gorun must refuse it.
func drawConfig(r *rand.Rand) Config {
	names := make([]string, MaxHosts)
	for i := range names {
		names[i] = "h" + strconv.Itoa(i)
	}
	for {
		c := drawOnce(r)
		if Precheck(c, names).Err == nil || r.IntN(10) == 0 {
			return c
		}
	}
}

// drawOnce draws a configuration, valid or not.
func drawOnce(r *rand.Rand) Config {
	c := Config{Workload: Dptrain, Recovery: pick(r, "restart", "in-place"), Protect: "full"}
	switch w := r.IntN(8); {
	case w == 0:
		c.Workload, c.Recovery = Pytrain, "restart" // pytrain has no in-place rejoin
	case w == 1:
		c.Workload, c.Recovery = MPICH, "restart" // no rank client: restarted from the start
	}
	c.Hosts = 2 + r.IntN(3) // 2..4
	c.Spares = r.IntN(min(3, MaxHosts-c.Hosts+1))
	c.RanksPerHost = 1 + r.IntN(2)
	// A layout now and then: --tp 2 or --pp 2 where the world divides
	// (the data-parallel rings replicas are placed on get shorter).
	c.TP, c.PP = 1, 1
	if c.NP() >= 4 && c.NP()%2 == 0 {
		switch r.IntN(6) {
		case 0:
			c.TP = 2
		case 1:
			c.PP = 2
		}
	}
	// Redundancy: replicas:1 and 2 and the erasure codes that fit the
	// host count, replicas:0 now and then; one time in ten any of them,
	// whether it fits or not (gorun must refuse what does not).
	opts := []string{"replicas:1", "replicas:1"}
	if c.Hosts >= 3 {
		opts = append(opts, "replicas:2")
	}
	switch c.Hosts {
	case 2:
		opts = append(opts, "ec:1+1")
	case 3:
		opts = append(opts, "ec:2+1", "ec:1+2")
	case 4:
		opts = append(opts, "ec:2+2", "ec:1+1", "ec:3+1")
	}
	switch r.IntN(12) {
	case 0:
		opts = []string{"replicas:0"}
	case 1:
		opts = []string{"replicas:2", "replicas:3", "ec:2+2", "ec:2+1", "ec:3+1"}
	}
	c.Redundancy = pick(r, opts...)
	if c.Workload == Dptrain && c.Redundancy != "replicas:0" && r.IntN(3) == 0 {
		c.Protect = "diff"
	}
	c.Durable = r.IntN(3) == 0 && c.Workload != MPICH // a program that declares no regions has nothing to save
	c.Params = pick(r, "64K", "128K", "200K")
	c.Steps = 30 + r.IntN(11)
	if c.Workload == Pytrain {
		// pytrain's steps take some 10 ms: ten times as many, so that
		// a fault lands in the middle of the job, not after its end.
		c.Steps *= 10
	}
	c.DeviceMs = 20 + 5*r.IntN(5)
	c.Seed = 1 + r.Uint64N(1000)
	return c
}

// flags for a log line.
func (c Config) flagsText() string {
	dir := ""
	if c.Durable {
		dir = "DIR"
	}
	return strings.Join(c.GorunFlags("HOSTFILE", "BRIDGE", "EVENTS", dir), " ")
}
