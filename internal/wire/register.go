package wire

import (
	"slices"
	"strings"
	"time"
)

// An agent's registration: Register, and the RegisterReply that carries the
// job's JobSpec.

// Register is what an agent sends when it has started: who it is and where
// its host can be reached.
type Register struct {
	Version    int    `json:"v"`
	Job        string `json:"job"`
	Host       int    `json:"host"`  // index of the host in the launcher's host list
	Name       string `json:"name"`  // host name as the launcher knows it
	Addr       string `json:"addr"`  // IP address other hosts reach this host at
	MasterPort int    `json:"mport"` // a free TCP port on this host, for MASTER_PORT
	// MasterPorts, when present, are distinct TCP ports that were free on
	// this host at registration (the agent keeps them bound until the
	// epoch that uses one starts), MasterPorts[0] == MasterPort: successive
	// epochs whose rank 0 is on this host take them in turn
	// (MasterPortOf), so a restarted job's store never binds or connects
	// to the port of the epoch before (a process of the old epoch still
	// there, or its connections in TIME_WAIT). Absent: MasterPort in every
	// epoch, as an agent that predates the field sent.
	MasterPorts []int `json:"mports,omitempty"`
	// ReplicaPort is the port, on Addr, of this host's replication
	// listener (state protection), or 0.
	ReplicaPort int `json:"rport,omitempty"`
	Pid         int `json:"pid"`
}

// DecodeRegister decodes and validates a Register.
func DecodeRegister(b []byte) (*Register, error) {
	var r Register
	if err := decode(b, &r, "register"); err != nil {
		return nil, err
	}
	switch {
	case r.Version != Version:
		return nil, malformed("register: protocol version %d, want %d", r.Version, Version)
	case !ValidJobID(r.Job):
		return nil, malformed("register: bad job id")
	case r.Host < 0 || r.Host >= MaxHosts:
		return nil, malformed("register: host index %d out of range", r.Host)
	case r.MasterPort < 0 || r.MasterPort > 65535:
		return nil, malformed("register: port %d out of range", r.MasterPort)
	case r.ReplicaPort < 0 || r.ReplicaPort > 65535:
		return nil, malformed("register: replica port %d out of range", r.ReplicaPort)
	}
	if err := checkMasterPorts(r.MasterPort, r.MasterPorts); err != nil {
		return nil, err
	}
	for _, s := range []string{r.Name, r.Addr} {
		if err := checkString("register field", s); err != nil {
			return nil, err
		}
	}
	return &r, nil
}

// MaxMasterPorts bounds Register.MasterPorts.
const MaxMasterPorts = 16

// checkMasterPorts checks a registration's MASTER_PORT pool: at most
// MaxMasterPorts ports, each in 1..65535, distinct, the first one mport.
func checkMasterPorts(mport int, pool []int) error {
	switch {
	case pool == nil:
		return nil
	case len(pool) == 0:
		return malformed("register: empty master port pool (omit it)")
	case len(pool) > MaxMasterPorts:
		return malformed("register: %d master ports, at most %d", len(pool), MaxMasterPorts)
	case pool[0] != mport:
		return malformed("register: master port pool starts with %d, the master port is %d", pool[0], mport)
	}
	for i, p := range pool {
		if p < 1 || p > 65535 {
			return malformed("register: master port pool: port %d out of range", p)
		}
		if slices.Contains(pool[:i], p) {
			return malformed("register: master port pool: port %d twice", p)
		}
	}
	return nil
}

// MasterPortOf is the MASTER_PORT of the turn-th epoch (counting from 0,
// one per table with a new epoch) whose rank 0 is on the host of r: its
// pool's ports in turn, or its one MasterPort without a pool.
func MasterPortOf(r *Register, turn uint64) int {
	if len(r.MasterPorts) == 0 {
		return r.MasterPort
	}
	return r.MasterPorts[turn%uint64(len(r.MasterPorts))]
}

// JobSpec is what every agent needs to start its ranks. It travels in the
// registration reply, not in the agent's argv, so that values given with
// -x never show in a process listing.
type JobSpec struct {
	Prog string   `json:"prog"`
	Args []string `json:"args"`
	Env  []string `json:"env"` // KEY=VALUE set for every rank (-x)
	Dir  string   `json:"dir"` // working directory of the ranks
	// DirExplicit says Dir was asked for (--wdir): a host without it fails
	// the job. Otherwise Dir is the launcher's directory, and a host
	// without it uses the home directory, as mpirun does.
	DirExplicit       bool          `json:"dirx,omitempty"`
	KillGrace         time.Duration `json:"grace"`
	HeartbeatInterval time.Duration `json:"hb"`
	OutputDelay       time.Duration `json:"odelay"` // how long an agent may hold output before sending
	// StdinRank is the rank that reads the launcher's standard input, or
	// NoStdin.
	StdinRank int `json:"stdin"`
	// TP and PP are the parallel layout's tensor- and pipeline-parallel
	// sizes (0 means 1); they divide the world size.
	TP int `json:"tp,omitempty"`
	PP int `json:"pp,omitempty"`
	// GPUsPerRank is how many GPUs each local rank gets (0: one each,
	// shared round-robin when ranks outnumber GPUs).
	GPUsPerRank int `json:"gpr,omitempty"`
	// NoPMI: the ranks get no PMI connection (--pmi=false).
	NoPMI bool `json:"nopmi,omitempty"`
	// MPI is the MPI the program is built with, as the launcher found it
	// (--mpi): "openmpi" or "mpich", or "" when not known (the ranks then
	// get what either needs). PMILibrary is the PMI-1 client library Open
	// MPI ranks load ("": the one beside the agent's executable).
	MPI        string `json:"mpi,omitempty"`
	PMILibrary string `json:"pmilib,omitempty"`
	// MaxRestarts is how many times the ranks may be restarted in place
	// after a failure (--max-restarts).
	MaxRestarts int `json:"maxrestarts,omitempty"`
	// ProtectMode is how the ranks' protected state reaches its replica
	// holders (gorun --protect-mode): "" or "full", or "diff" with the
	// Diff settings below, which are zero otherwise. The agent parses it
	// (rank.ParseProtectMode) and refuses any other value; the decoder
	// only bounds what it cannot know.
	ProtectMode string `json:"pmode,omitempty"`
	// DiffFold is gorun --diff-fold (0 to MaxDiffFold; 0: rank's default).
	DiffFold int `json:"dfold,omitempty"`
	// BaseEvery is gorun --base-every (0 to MaxBaseEvery; 0: rank's
	// default).
	BaseEvery int `json:"bevery,omitempty"`
	// DiffCodec is gorun --diff-codec as given ("" = raw), parsed by the
	// agent with rank.ParseDiffCodec.
	DiffCodec string `json:"dcodec,omitempty"`
	// The durable tier (gorun --ckpt-dir and the flags that go with it;
	// durable.go has their bounds): CkptDir is the job's checkpoint
	// directory, an absolute path ("": no durable tier, and the fields
	// below are zero).
	CkptDir string `json:"cdir,omitempty"`
	// CkptEvery is --ckpt-every: a base every this many steps.
	CkptEvery int `json:"cevery,omitempty"`
	// CkptConcurrency is --ckpt-concurrency (0: automatic).
	CkptConcurrency int `json:"cconc,omitempty"`
	// CkptOverhead is --ckpt-overhead, the fraction of the step time the
	// automatic concurrency allows the saves to cost (0 < q < 1).
	CkptOverhead float64 `json:"cover,omitempty"`
	// DiffBatch is --diff-batch: steps per batch of differentials on
	// disk (diff mode; 0: the default).
	DiffBatch int `json:"dbatch,omitempty"`
	// Resume is --resume: the job resumes from CkptDir's commit record.
	Resume bool `json:"resume,omitempty"`
}

// Bounds of a JobSpec's protection settings.
const (
	MaxDiffFold  = 4096
	MaxBaseEvery = 1 << 31
	// MaxProtectString bounds ProtectMode and DiffCodec.
	MaxProtectString = 64
)

// NoStdin is JobSpec.StdinRank when no rank reads the launcher's stdin.
const NoStdin = -1

// RegisterReply answers a Register: an error, or Stop (the job was
// stopped before it started, or has ended: exit), or the job's spec.
type RegisterReply struct {
	Err  string   `json:"err,omitempty"`
	Stop bool     `json:"stop,omitempty"`
	Spec *JobSpec `json:"spec,omitempty"`
}

// DecodeRegisterReply decodes and validates a RegisterReply.
func DecodeRegisterReply(b []byte) (*RegisterReply, error) {
	var r RegisterReply
	if err := decode(b, &r, "register reply"); err != nil {
		return nil, err
	}
	if r.Stop {
		if r.Spec != nil || r.Err != "" {
			return nil, malformed("register reply: stop with an error or a spec")
		}
		return &r, nil
	}
	if r.Err != "" {
		if r.Spec != nil {
			return nil, malformed("register reply: both an error and a spec")
		}
		if err := checkString("register reply error", r.Err); err != nil {
			return nil, err
		}
		return &r, nil
	}
	s := r.Spec
	if s == nil {
		return nil, malformed("register reply: no job spec")
	}
	if s.Prog == "" {
		return nil, malformed("register reply: empty program")
	}
	if len(s.Args) > MaxArgs || len(s.Env) > MaxArgs {
		return nil, malformed("register reply: too many arguments")
	}
	// What exec accepts: no NUL anywhere, and at most MaxArgBytes in all.
	size := len(s.Prog) + len(s.Dir)
	for _, a := range append([]string{s.Prog, s.Dir}, s.Args...) {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, malformed("register reply: NUL byte in program, argument or directory")
		}
		size += len(a)
	}
	for _, e := range s.Env {
		if i := strings.IndexByte(e, '='); i <= 0 || strings.IndexByte(e, 0) >= 0 {
			return nil, malformed("register reply: env entry %q is not KEY=VALUE", Truncate(e))
		}
		size += len(e)
	}
	if size > MaxArgBytes {
		return nil, malformed("register reply: arguments and environment exceed %d bytes", MaxArgBytes)
	}
	if s.StdinRank < NoStdin || s.StdinRank >= MaxWorld {
		return nil, malformed("register reply: stdin rank %d out of range", s.StdinRank)
	}
	if s.KillGrace < 0 || s.HeartbeatInterval <= 0 || s.OutputDelay < 0 {
		return nil, malformed("register reply: bad durations")
	}
	if len(s.ProtectMode) > MaxProtectString || len(s.DiffCodec) > MaxProtectString {
		return nil, malformed("register reply: protect mode or diff codec longer than %d bytes", MaxProtectString)
	}
	if s.DiffFold < 0 || s.DiffFold > MaxDiffFold || s.BaseEvery < 0 || int64(s.BaseEvery) > MaxBaseEvery {
		return nil, malformed("register reply: diff fold %d or base-every %d out of range", s.DiffFold, s.BaseEvery)
	}
	if err := checkDurableSpec(s); err != nil {
		return nil, err
	}
	return &r, nil
}
