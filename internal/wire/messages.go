package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Version is the control-plane protocol version. An agent and a launcher of
// different versions refuse each other at registration.
const Version = 1

// Limits on what a decoder accepts; they bound memory on hostile input.
const (
	MaxWorld     = 1 << 24
	MaxHosts     = 1 << 20
	MaxArgs      = 1 << 16
	MaxStringLen = 1 << 16
	MaxArgBytes  = 8 << 20 // program, arguments and -x variables together
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("wire: malformed message")

func malformed(what string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(what, args...))
}

// decode unmarshals one JSON value from b into v, rejecting unknown fields
// and trailing data.
//
// Field names match case-insensitively and the last of duplicate keys
// wins (encoding/json's rules); every value is validated after decoding.
func decode(b []byte, v any, what string) error {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return malformed("%s: not a JSON object", what)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
	}
	if _, err := d.Token(); err != io.EOF {
		return malformed("%s: trailing data", what)
	}
	return nil
}

func checkString(what, s string) error {
	if len(s) > MaxStringLen {
		return malformed("%s longer than %d bytes", what, MaxStringLen)
	}
	return nil
}

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

// HolderRow says which ranks hold rank Rank's replicas.
type HolderRow struct {
	Rank    int   `json:"r"`
	Holders []int `json:"h"`
}

// MaxHolders bounds the replica holders of one rank in a message.
const MaxHolders = 16

// RestoreRow says where rank Rank restores its state from when its own
// host's slot cannot serve it (hot-swap's restore plan): the optimizer
// shard and meta from the copy kept on rank Opt's host (Opt may no longer
// hold Rank's replicas in the epoch: it has the copy that exists), the
// parameters from data-parallel peer Params.
//
// Decode: Rank's optimizer shard and meta are rebuilt from the erasure
// code of its group (EpochTable.EC) instead, because no clear copy of
// them survives; Opt is then unused (any rank of the world,
// conventionally Rank itself). Only a table with EC may have such rows.
type RestoreRow struct {
	Rank   int  `json:"r"`
	Opt    int  `json:"o"`
	Params int  `json:"p"`
	Decode bool `json:"d,omitempty"`
}

// ECTable is the erasure-coding layout of a job run with
// --redundancy ec:K+M (ckpt.Codec; topology.PlanEC plans it): groups of
// K data and M parity hosts. Host indices are the EpochTable's Hosts.
type ECTable struct {
	K      int          `json:"k"`
	M      int          `json:"m"`
	Groups []ECGroupRow `json:"g"`
}

// ECGroupRow is one erasure-coding group (topology.ECGroup): its hosts in
// group order, its data hosts (Data[j] keeps DataGroups[j]'s ranks' state
// in the clear), its parity hosts (Parity[j] keeps parity row j of every
// stripe of the group), and its K data groups of ranks; stripe i is the K
// ranks DataGroups[0..K)[i].
type ECGroupRow struct {
	Hosts      []int   `json:"h"`
	Data       []int   `json:"d"`
	Parity     []int   `json:"p"`
	DataGroups [][]int `json:"dg"`
}

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
			return nil, malformed("register reply: env entry %q is not KEY=VALUE", truncate(e))
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

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// EpochTable is the world of one epoch: which host runs which ranks and
// where they are. The launcher publishes it once per epoch to every agent.
type EpochTable struct {
	Version    int         `json:"v"`
	Job        string      `json:"job"`
	Epoch      uint64      `json:"epoch"`
	World      int         `json:"world"`
	MasterAddr string      `json:"maddr"`
	MasterPort int         `json:"mport"`
	Hosts      []TableHost `json:"hosts"`
	// Gen is the restart generation whose ranks run in this epoch: a rank
	// a table places on a host that does not run it yet starts in it.
	Gen uint64 `json:"gen,omitempty"`
	// G is the step the ranks restoring in this epoch resume from (-1:
	// from the start).
	G int64 `json:"g"`
	// Holders are the replica holders of every rank that has any, one
	// row per rank, in rank order (none: no replicas). The table is their
	// one source: a recovery epoch may re-place them.
	Holders []HolderRow `json:"hold,omitempty"`
	// Restore is the restore plan of the ranks that cannot restore from
	// their own host's slot in this epoch, in rank order.
	Restore []RestoreRow `json:"rest,omitempty"`
	// EC is the erasure-coding layout (nil: replicas only). With it,
	// Holders are the clear copies' holders: each rank's data host's
	// lowest rank, none for a rank that runs on its data host.
	EC *ECTable `json:"ec,omitempty"`
	// Logs are, in diff mode under erasure coding, every rank's log-only
	// holders (topology.ECLogHolders), one row per rank that has any, in
	// rank order: the ranks that keep its differentials after the newest
	// coded base besides its clear copy's holder. H is the epoch's newest
	// coded base step (GlobalStep.H) when the table was published (-1:
	// none yet; 0 and omitted outside diff mode under EC).
	Logs []HolderRow `json:"logs,omitempty"`
	H    int64       `json:"h,omitempty"`
}

// TableHost is one host of an EpochTable.
type TableHost struct {
	Name  string  `json:"n"`
	Addr  string  `json:"a"`
	Ranks RankSet `json:"r"` // in local-rank order
	// ReplicaPort is the port of the host's replication listener, or 0.
	ReplicaPort int `json:"rp,omitempty"`
	// Spare: an idle spare host, registered, running no rank. Fenced: a
	// lost host, never to be contacted again (its agent, if it is still
	// there, kills its ranks and exits). Neither has ranks.
	Spare  bool `json:"sp,omitempty"`
	Fenced bool `json:"f,omitempty"`
}

// Validate checks the invariants of t.
func (t *EpochTable) Validate() error {
	switch {
	case t.Version != Version:
		return malformed("epoch table: protocol version %d, want %d", t.Version, Version)
	case !ValidJobID(t.Job):
		return malformed("epoch table: bad job id")
	case t.World < 1 || t.World > MaxWorld:
		return malformed("epoch table: world size %d out of range", t.World)
	case len(t.Hosts) < 1 || len(t.Hosts) > MaxHosts:
		return malformed("epoch table: %d hosts", len(t.Hosts))
	case t.MasterPort < 0 || t.MasterPort > 65535:
		return malformed("epoch table: master port %d", t.MasterPort)
	}
	if err := checkString("master address", t.MasterAddr); err != nil {
		return err
	}
	seen := make([]bool, t.World)
	n := 0
	for i, h := range t.Hosts {
		if err := checkString("host name", h.Name); err != nil {
			return err
		}
		if err := checkString("host address", h.Addr); err != nil {
			return err
		}
		if h.ReplicaPort < 0 || h.ReplicaPort > 65535 {
			return malformed("epoch table host %d: replica port %d", i, h.ReplicaPort)
		}
		if (h.Spare || h.Fenced) && len(h.Ranks) > 0 {
			return malformed("epoch table host %d: a spare or fenced host with ranks", i)
		}
		if err := h.Ranks.check(t.World); err != nil {
			return fmt.Errorf("%w: epoch table host %d: %w", ErrMalformed, i, err)
		}
		for _, r := range h.Ranks {
			if n += r.Count; n > t.World {
				return malformed("epoch table: more than %d ranks placed", t.World)
			}
			for k, rank := 0, r.First; k < r.Count; k, rank = k+1, rank+r.Stride {
				if seen[rank] {
					return malformed("epoch table: rank %d appears twice", rank)
				}
				seen[rank] = true
			}
		}
	}
	if n != t.World {
		return malformed("epoch table: %d of %d ranks placed", n, t.World)
	}
	if t.G < -1 || t.G > MaxStep {
		return malformed("epoch table: resume step %d", t.G)
	}
	return t.checkPlan()
}

// checkPlan checks the holder and restore rows of t: ranks of the world,
// in increasing rank order (so one row per rank), no rank its own holder,
// no holder twice, no rank restoring from its own copy (a decoding row's
// Opt is unused: any rank of the world, conventionally Rank); and the
// erasure-coding layout (checkEC).
func (t *EpochTable) checkPlan() error {
	if len(t.Holders) > t.World || len(t.Restore) > t.World {
		return malformed("epoch table: %d holder rows and %d restore rows for %d ranks", len(t.Holders), len(t.Restore), t.World)
	}
	inWorld := func(r int) bool { return r >= 0 && r < t.World }
	if err := checkHolderRows(t.Holders, t.World, "holder"); err != nil {
		return err
	}
	if len(t.Logs) > 0 && t.EC == nil {
		return malformed("epoch table: %d log holder rows, but the table has no erasure code", len(t.Logs))
	}
	if err := checkHolderRows(t.Logs, t.World, "log holder"); err != nil {
		return err
	}
	if t.H < -1 || t.H > MaxStep || t.G >= 0 && t.H > t.G || t.G < 0 && t.H > 0 {
		return malformed("epoch table: coded base step %d with resume step %d", t.H, t.G)
	}
	last := -1
	for _, row := range t.Restore {
		if !inWorld(row.Rank) || row.Rank <= last {
			return malformed("epoch table: restore row of rank %d out of order or range", row.Rank)
		}
		last = row.Rank
		if !inWorld(row.Opt) || !inWorld(row.Params) || row.Opt == row.Rank && !row.Decode {
			return malformed("epoch table: rank %d restores from ranks %d and %d", row.Rank, row.Opt, row.Params)
		}
	}
	return t.checkEC()
}

// checkHolderRows checks rows of holders (what: "holder" or "log
// holder") of a world of world ranks: at most one row per rank, in
// increasing rank order, each naming 1 to MaxHolders distinct ranks of
// the world other than its own.
func checkHolderRows(rows []HolderRow, world int, what string) error {
	if len(rows) > world {
		return malformed("epoch table: %d %s rows for %d ranks", len(rows), what, world)
	}
	inWorld := func(r int) bool { return r >= 0 && r < world }
	last := -1
	for _, row := range rows {
		if !inWorld(row.Rank) || row.Rank <= last {
			return malformed("epoch table: %s row of rank %d out of order or range", what, row.Rank)
		}
		last = row.Rank
		if len(row.Holders) == 0 || len(row.Holders) > MaxHolders {
			return malformed("epoch table: rank %d has %d %ss", row.Rank, len(row.Holders), what)
		}
		for i, h := range row.Holders {
			if !inWorld(h) || h == row.Rank {
				return malformed("epoch table: rank %d %s rank %d", row.Rank, what+" is", h)
			}
			if slices.Contains(row.Holders[:i], h) {
				return malformed("epoch table: rank %d has %s rank %d twice", row.Rank, what, h)
			}
		}
	}
	return nil
}

// LogLists returns every rank's log-only holders (nil rows for ranks
// without; nil without any), as HolderLists does the holders.
func (t *EpochTable) LogLists() [][]int {
	return rowLists(t.Logs, t.World)
}

// HolderLists returns every rank's holders (nil rows for ranks without;
// nil without any holders).
func (t *EpochTable) HolderLists() [][]int {
	return rowLists(t.Holders, t.World)
}

// rowLists returns rows as a list per rank of world (nil without rows).
func rowLists(rows []HolderRow, world int) [][]int {
	if len(rows) == 0 {
		return nil
	}
	out := make([][]int, world)
	for _, row := range rows {
		out[row.Rank] = row.Holders
	}
	return out
}

// Placement is where one rank runs in an epoch.
type Placement struct {
	Rank, Host, LocalRank, LocalSize, NodeRank int
}

// Placements returns, for every host index, the placements of its ranks in
// local-rank order. NodeRank counts only hosts that run ranks, in host order.
// t must be valid.
func (t *EpochTable) Placements() [][]Placement {
	out := make([][]Placement, len(t.Hosts))
	node := 0
	for i, h := range t.Hosts {
		ranks, _ := h.Ranks.Expand(t.World)
		if len(ranks) == 0 {
			continue
		}
		ps := make([]Placement, len(ranks))
		for l, r := range ranks {
			ps[l] = Placement{Rank: r, Host: i, LocalRank: l, LocalSize: len(ranks), NodeRank: node}
		}
		out[i] = ps
		node++
	}
	return out
}

// NodeCount is the number of hosts in t that run ranks.
func (t *EpochTable) NodeCount() int {
	n := 0
	for _, h := range t.Hosts {
		if len(h.Ranks) > 0 {
			n++
		}
	}
	return n
}

// EventKind says what an Event reports.
type EventKind string

// Event kinds.
const (
	EventStarted    EventKind = "started"     // a rank's process started
	EventExited     EventKind = "exited"      // a rank's process ended
	EventAgentError EventKind = "agent-error" // the agent cannot go on
	EventAgentDone  EventKind = "agent-done"  // every rank of the agent has ended
	EventGPU        EventKind = "gpu"         // a GPU health event (GPU set)
	// EventEpoch: the agent has epoch Epoch's table.
	EventEpoch EventKind = "epoch"
	// EventReplFailed: replication from this host to host Peer failed
	// (Msg says why).
	EventReplFailed EventKind = "repl-failed"
	// EventPeerLost: rank Rank lost its links to ranks Peers (a
	// comm.PeerLostError).
	EventPeerLost EventKind = "peer-lost"
)

// MaxPeers bounds the peers an EventPeerLost names.
const MaxPeers = 1024

// MaxGPUs bounds a GPU index in a message.
const MaxGPUs = 1024

// GPU classes of a GPUReport, as package gpu names them.
const (
	GPUTransient = "transient"
	GPUPermanent = "permanent"
	GPUUnknown   = "unknown"
)

// GPUReport is the GPU part of an EventGPU: which device, what happened,
// its classification, and the ranks bound to the device. Msg describes it.
type GPUReport struct {
	Index int    `json:"i"`
	UUID  string `json:"uuid"`
	Kind  string `json:"kind"` // "xid", "ecc-double-bit", ...
	XID   uint64 `json:"xid,omitempty"`
	Class string `json:"class"`
	Ranks []int  `json:"ranks,omitempty"`
}

// Event is a report from an agent.
type Event struct {
	Kind EventKind `json:"k"`
	Host int       `json:"h"`
	Rank int       `json:"r"`
	Pid  int       `json:"pid,omitempty"`
	// Code is the exit status, or -1 when the process was ended by Signal.
	Code   int `json:"code"`
	Signal int `json:"sig,omitempty"`
	// Stopped is set when the rank ended after gorun asked it to stop, so its
	// exit is not a failure of its own.
	Stopped bool `json:"stopped,omitempty"`
	// Gen is the restart generation of the rank process (0: the first).
	Gen uint64 `json:"gen,omitempty"`
	// Abort: the rank called MPI_Abort (PMI abort) with exit code Code.
	Abort bool       `json:"abort,omitempty"`
	Msg   string     `json:"msg,omitempty"`
	GPU   *GPUReport `json:"gpu,omitempty"`   // EventGPU only
	Epoch uint64     `json:"epoch,omitempty"` // EventEpoch only
	Peer  int        `json:"peer,omitempty"`  // EventReplFailed only: a host
	Peers []int      `json:"peers,omitempty"` // EventPeerLost only: ranks
	// Corrupt: EventExited only, the rank's restore failed and the copies
	// of its state that holder ranks sent it failed their CRC32C
	// (rank.CopiesCorruptError): the launcher counts them lost.
	Corrupt *CorruptCopies `json:"corrupt,omitempty"`
}

// CorruptCopies are the replica holders whose copies of a rank's state at
// Step failed their CRC32C in the rank's restore.
type CorruptCopies struct {
	Step    int64 `json:"step"`
	Holders []int `json:"holders"`
}

// check validates c, the copies of rank's state.
func (c *CorruptCopies) check(rank int) error {
	if c.Step < 0 || len(c.Holders) == 0 || len(c.Holders) > MaxPeers {
		return malformed("event: rank %d's corrupt copies of step %d at %d holders", rank, c.Step, len(c.Holders))
	}
	for _, x := range c.Holders {
		if x < 0 || x >= MaxWorld || x == rank {
			return malformed("event: rank %d's corrupt copy at holder rank %d", rank, x)
		}
	}
	return nil
}

// DecodeEvent decodes and validates an Event.
func DecodeEvent(b []byte) (*Event, error) {
	var e Event
	if err := decode(b, &e, "event"); err != nil {
		return nil, err
	}
	if e.GPU != nil && e.Kind != EventGPU {
		return nil, malformed("event: a %s event with a GPU report", e.Kind)
	}
	if len(e.Peers) > 0 && e.Kind != EventPeerLost {
		return nil, malformed("event: a %s event naming peers", e.Kind)
	}
	if e.Corrupt != nil {
		if e.Kind != EventExited {
			return nil, malformed("event: a %s event with corrupt copies", e.Kind)
		}
		if err := e.Corrupt.check(e.Rank); err != nil {
			return nil, err
		}
	}
	switch e.Kind {
	case EventStarted, EventExited:
		if e.Rank < 0 {
			return nil, malformed("event: a %s event of rank %d", e.Kind, e.Rank)
		}
	case EventAgentError, EventAgentDone, EventEpoch:
	case EventReplFailed:
		if e.Peer < 0 || e.Peer >= MaxHosts || e.Peer == e.Host {
			return nil, malformed("event: replication to host %d failed, from host %d", e.Peer, e.Host)
		}
	case EventPeerLost:
		if e.Rank < 0 || len(e.Peers) == 0 || len(e.Peers) > MaxPeers {
			return nil, malformed("event: rank %d lost %d peers", e.Rank, len(e.Peers))
		}
		for _, p := range e.Peers {
			if p < 0 || p >= MaxWorld || p == e.Rank {
				return nil, malformed("event: rank %d lost peer %d", e.Rank, p)
			}
		}
	case EventGPU:
		if err := e.GPU.check(); err != nil {
			return nil, err
		}
	default:
		return nil, malformed("event: unknown kind %q", truncate(string(e.Kind)))
	}
	if e.Host < 0 || e.Host >= MaxHosts || e.Rank < -1 || e.Rank >= MaxWorld {
		return nil, malformed("event: host %d rank %d out of range", e.Host, e.Rank)
	}
	if e.Signal < 0 || e.Signal > 128 {
		return nil, malformed("event: signal %d out of range", e.Signal)
	}
	if err := checkString("event message", e.Msg); err != nil {
		return nil, err
	}
	return &e, nil
}

func (g *GPUReport) check() error {
	switch {
	case g == nil:
		return malformed("event: a gpu event without its report")
	case g.Index < 0 || g.Index >= MaxGPUs:
		return malformed("event: GPU index %d out of range", g.Index)
	case g.Class != GPUTransient && g.Class != GPUPermanent && g.Class != GPUUnknown:
		return malformed("event: GPU class %q", truncate(g.Class))
	case len(g.Ranks) > MaxGPUs*8:
		return malformed("event: %d ranks on one GPU", len(g.Ranks))
	}
	for _, r := range g.Ranks {
		if r < 0 || r >= MaxWorld {
			return malformed("event: GPU rank %d out of range", r)
		}
	}
	if err := checkString("GPU UUID", g.UUID); err != nil {
		return err
	}
	return checkString("GPU event kind", g.Kind)
}

// ExitStatus is the status a shell would report for e: Code, or 128+Signal.
func (e *Event) ExitStatus() int {
	if e.Signal > 0 {
		return 128 + e.Signal
	}
	return e.Code
}

// ControlOp is an order from the launcher to the agents.
type ControlOp string

// Control operations.
const (
	// OpSignal sends Signal to every rank; the job goes on.
	OpSignal ControlOp = "signal"
	// OpStop sends Signal to every rank, then SIGKILL after Grace.
	OpStop ControlOp = "stop"
	// OpKill sends SIGKILL to every rank at once.
	OpKill ControlOp = "kill"
	// OpExit tells agents to clean up and exit; their ranks have ended.
	// It carries the durable tier's last D and X (GlobalStep.D and X, as
	// last published): an agent applies them before it closes its
	// stores, whether or not the G that carried them reached it first.
	OpExit ControlOp = "exit"
	// OpRestart starts restart generation Gen: agents kill their ranks,
	// discard protected steps after G, and start the ranks again in
	// Epoch's table, where they restore step G.
	OpRestart ControlOp = "restart"
	// OpReach asks each agent for the reach on disk (as for --resume:
	// ResumeReach, with Epoch) of its ranks in Ranks, the rank → host
	// table of epoch Epoch, from the commit record's step G: the job rolls
	// back to the durable tier (a lost rank's state is in no memory tier).
	OpReach ControlOp = "reach"
	// OpProbe asks the agent of host Host for a heartbeat at once: the
	// launcher suspects the host, and its answer clears the suspicion.
	OpProbe ControlOp = "probe"
)

// Control is broadcast by the launcher to every agent of the job.
type Control struct {
	Op     ControlOp     `json:"op"`
	Signal int           `json:"sig,omitempty"`
	Grace  time.Duration `json:"grace,omitempty"`
	// OpRestart only.
	Gen   uint64 `json:"gen,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	G     int64  `json:"g,omitempty"`
	// OpRestart only: every agent rebuilds each of its ranks' states at
	// G from the durable tier before it starts them (a roll-back).
	Disk bool `json:"disk,omitempty"`
	// OpReach only: every rank's host.
	Ranks []int `json:"ranks,omitempty"`
	// OpProbe only: the host asked.
	Host int `json:"host,omitempty"`
	// OpExit only: the durable tier's watermark and resolved step as the
	// launcher last published them (GlobalStep.D and X; nil: none), its
	// decisions being final once it tells the agents to exit. D <= X.
	D *int64 `json:"d,omitempty"`
	X *int64 `json:"x,omitempty"`
}

// DecodeControl decodes and validates a Control.
func DecodeControl(b []byte) (*Control, error) {
	var c Control
	if err := decode(b, &c, "control"); err != nil {
		return nil, err
	}
	switch c.Op {
	case OpSignal, OpStop:
		if c.Signal < 1 || c.Signal > 64 {
			return nil, malformed("control: signal %d out of range", c.Signal)
		}
	case OpKill, OpExit:
		if c.Signal != 0 {
			return nil, malformed("control: %s takes no signal", c.Op)
		}
	case OpRestart:
		if c.Signal != 0 || c.Gen == 0 || c.G < -1 || c.G > MaxStep {
			return nil, malformed("control: restart generation %d from step %d", c.Gen, c.G)
		}
	case OpReach:
		if c.Signal != 0 || c.G < 0 || c.G > MaxStep || len(c.Ranks) == 0 || len(c.Ranks) > MaxWorld {
			return nil, malformed("control: reach from step %d of %d ranks", c.G, len(c.Ranks))
		}
		for _, h := range c.Ranks {
			if h < 0 || h >= MaxHosts {
				return nil, malformed("control: reach: host %d out of range", h)
			}
		}
	case OpProbe:
		if c.Signal != 0 || c.Host < 0 || c.Host >= MaxHosts {
			return nil, malformed("control: probe of host %d", c.Host)
		}
	default:
		return nil, malformed("control: unknown op %q", truncate(string(c.Op)))
	}
	if c.Grace < 0 {
		return nil, malformed("control: negative grace")
	}
	if c.Host != 0 && c.Op != OpProbe {
		return nil, malformed("control: %s names a host", c.Op)
	}
	if c.Disk && c.Op != OpRestart || c.Ranks != nil && c.Op != OpReach {
		return nil, malformed("control: %s with a roll-back's fields", c.Op)
	}
	if (c.D != nil || c.X != nil) && c.Op != OpExit {
		return nil, malformed("control: %s with the durable tier's watermark", c.Op)
	}
	if c.D != nil && (*c.D < 0 || *c.D > MaxStep) || c.X != nil && (*c.X < 0 || *c.X > MaxStep || c.D != nil && *c.D > *c.X) {
		return nil, malformed("control: exit with durable commit %v and resolved step %v", stepString(c.D), stepString(c.X))
	}
	return &c, nil
}

// Heartbeat is sent by every agent at the job's heartbeat interval.
type Heartbeat struct {
	Host int    `json:"h"`
	Seq  uint64 `json:"s"`
}

// DecodeHeartbeat decodes and validates a Heartbeat.
func DecodeHeartbeat(b []byte) (*Heartbeat, error) {
	var h Heartbeat
	if err := decode(b, &h, "heartbeat"); err != nil {
		return nil, err
	}
	if h.Host < 0 || h.Host >= MaxHosts {
		return nil, malformed("heartbeat: host %d out of range", h.Host)
	}
	return &h, nil
}

// Marshal encodes any of the JSON messages of this package.
func Marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Every message type here is plain data; failure is a programming error.
		panic(fmt.Sprintf("wire: marshal %T: %v", v, err))
	}
	return b
}

// stepString is *v in decimal, or "none" if v is nil.
func stepString(v *int64) string {
	if v == nil {
		return "none"
	}
	return strconv.FormatInt(*v, 10)
}
