package wire

import (
	"fmt"
	"slices"
)

// EpochTable, the world of one epoch, with its rows (holders, restore plan,
// erasure-coding layout), its invariants (Validate) and its views; its binary
// form is in table.go.

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
