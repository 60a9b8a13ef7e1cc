package hotswap

import (
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/topology"
)

// Recovery is how surviving ranks take part in a recovery epoch.
type Recovery int

const (
	// RecoveryRestart restarts every rank in a new generation, each
	// resuming from G (wrapped trainers that cannot rebuild their
	// communicators).
	RecoveryRestart Recovery = iota
	// RecoveryInPlace keeps surviving ranks running: they rebuild their
	// communicators for the new epoch and roll back to G themselves.
	RecoveryInPlace
)

func (r Recovery) String() string {
	if r == RecoveryInPlace {
		return "in-place"
	}
	return "restart"
}

// OnNoSpare is what to do when a host is lost and no spare is left.
type OnNoSpare int

const (
	// OnNoSpareFreeSlots moves the lost ranks to a surviving host with
	// enough free slots (the default).
	OnNoSpareFreeSlots OnNoSpare = iota
	// OnNoSpareAbort stops the job with a report.
	OnNoSpareAbort
)

func (p OnNoSpare) String() string {
	if p == OnNoSpareAbort {
		return "abort"
	}
	return "free-slots"
}

// Defaults for the zero durations of a [Config].
const (
	DefaultFailWindow       = 250 * time.Millisecond
	DefaultSuspectTimeout   = time.Second
	DefaultHeartbeatTimeout = 10 * time.Second
	DefaultKillGrace        = 10 * time.Second
)

// Config is a job as the machine sees it. Hosts, Assign and Holders are
// read by [New] and copied; the caller may reuse them.
type Config struct {
	World int // number of ranks, >= 1
	// Hosts are the job's hosts, spares included (Host.Spare, and the
	// last Spares hosts). Rack (else Switch) is a host's failure domain.
	Hosts []topology.Host
	// Spares makes the last Spares hosts spares, as --spares does, in
	// addition to those marked Spare.
	Spares int
	// Assign maps every rank to its host (an index into Hosts), as
	// topology.MapRanks gives it. No rank is on a spare.
	Assign []int
	// TP and PP are the layout's tensor- and pipeline-parallel sizes (0 =
	// 1): a rank's data-parallel peers (same TP/PP coordinate) hold its
	// parameters, and are where holders are re-placed.
	TP, PP int
	// Holders[r] are the ranks that keep a copy of rank r's optimizer
	// shard (k-way, as topology.Place gives them), or nil without
	// replicas.
	Holders [][]int
	// EC is the erasure-coding layout of a job run with --redundancy
	// ec:K+M (topology.PlanEC over Hosts and Assign), or nil. Holders are
	// then the clear copies' holders.
	EC []topology.ECGroup
	// Diff: the ranks protect their state with --protect-mode diff. Under
	// EC only base steps are coded then (parity cannot absorb a
	// differential): a lost rank's state is decoded at H, the newest
	// base every rank has coded, and its differentials (H, G] replayed
	// from a copy of its log, which its clear copy's holder keeps and so
	// do its log-only holders, Logs[r] (topology.ECLogHolders; worked out
	// from EC and Assign when nil). Logs is only for Diff under EC.
	Diff bool
	Logs [][]int

	// Durable: the job has a durable tier (--ckpt-dir). Once it has a
	// commit record (DiskCommitted), a lost rank whose state memory
	// cannot serve rolls the job back to what the disk reaches
	// (rollback.go) instead of stopping it; not under EC.
	Durable bool

	MaxRestarts   int // restarts in place after rank failures
	Recovery      Recovery
	OnNoSpare     OnNoSpare
	Oversubscribe bool // hosts may take up to MaxSlots ranks (0 = no limit)

	FailWindow       time.Duration // 0 = DefaultFailWindow
	SuspectTimeout   time.Duration // 0 = DefaultSuspectTimeout
	HeartbeatTimeout time.Duration // 0 = DefaultHeartbeatTimeout
	HangTimeout      time.Duration // a rank without progress this long has hung; 0 = off
	KillGrace        time.Duration // SIGTERM → SIGKILL; 0 = DefaultKillGrace; negative = at once
}

// validate checks c and fills its defaults. It returns the spare flags.
func (c *Config) validate() ([]bool, error) {
	bad := func(format string, args ...any) ([]bool, error) {
		return nil, fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.World < 1 {
		return bad("world size %d; need at least 1 rank", c.World)
	}
	if len(c.Hosts) == 0 {
		return bad("no hosts")
	}
	if c.Spares < 0 || c.Spares >= len(c.Hosts) {
		return bad("%d spares for %d hosts; need 0 to %d", c.Spares, len(c.Hosts), len(c.Hosts)-1)
	}
	names := make(map[string]int, len(c.Hosts))
	spare := make([]bool, len(c.Hosts))
	slots := 0
	for i, h := range c.Hosts {
		if h.Name == "" {
			return bad("host %d has no name", i)
		}
		if j, dup := names[h.Name]; dup {
			return bad("host %s given twice (hosts %d and %d)", h.Name, j, i)
		}
		names[h.Name] = i
		if h.Slots < 1 {
			return bad("host %s has %d slots; need at least 1", h.Name, h.Slots)
		}
		if h.MaxSlots != 0 && h.MaxSlots < h.Slots {
			return bad("host %s has max_slots %d below its %d slots", h.Name, h.MaxSlots, h.Slots)
		}
		spare[i] = h.Spare || i >= len(c.Hosts)-c.Spares
		if !spare[i] {
			slots += h.Slots
		}
	}
	if slots == 0 {
		return bad("every host is a spare; no host is left for the ranks")
	}
	if slots < c.World && !c.Oversubscribe {
		return bad("%d ranks but the hosts that are not spares have %d slots", c.World, slots)
	}
	if len(c.Assign) != c.World {
		return bad("%d ranks assigned for a world of %d", len(c.Assign), c.World)
	}
	load := make([]int, len(c.Hosts))
	for r, h := range c.Assign {
		if h < 0 || h >= len(c.Hosts) {
			return bad("rank %d on host %d; there are %d hosts", r, h, len(c.Hosts))
		}
		if spare[h] {
			return bad("rank %d on spare host %s", r, c.Hosts[h].Name)
		}
		load[h]++
	}
	for h, n := range load {
		if room := c.room(h); n > room && room > 0 {
			return bad("host %s has %d ranks for %d slots", c.Hosts[h].Name, n, room)
		}
	}
	tp, pp := max(c.TP, 1), max(c.PP, 1)
	if c.World%(tp*pp) != 0 {
		return bad("world %d is not a multiple of tp %d × pp %d", c.World, tp, pp)
	}
	if c.Holders != nil {
		if len(c.Holders) != c.World {
			return bad("replica holders for %d ranks in a world of %d", len(c.Holders), c.World)
		}
		for r, hs := range c.Holders {
			for i, x := range hs {
				if x < 0 || x >= c.World {
					return bad("rank %d's replica holder %d is not a rank", r, x)
				}
				if c.Assign[x] == c.Assign[r] {
					return bad("rank %d's replica holder %d is on its own host %s", r, x, c.Hosts[c.Assign[r]].Name)
				}
				for _, y := range hs[:i] {
					if c.Assign[y] == c.Assign[x] {
						return bad("rank %d has two replica holders (%d and %d) on host %s", r, y, x, c.Hosts[c.Assign[x]].Name)
					}
				}
				if c.EC == nil && (x%(tp) != r%tp || (x/(tp*(c.World/(tp*pp)))) != r/(tp*(c.World/(tp*pp)))) {
					return bad("rank %d's replica holder %d is not a data-parallel peer", r, x)
				}
			}
		}
	}
	if c.EC != nil {
		if err := c.validateEC(spare); err != nil {
			return nil, err
		}
	}
	if c.Logs != nil {
		if err := c.validateLogs(); err != nil {
			return nil, err
		}
	}
	if c.Recovery != RecoveryRestart && c.Recovery != RecoveryInPlace {
		return bad("unknown recovery mode %d", int(c.Recovery))
	}
	if c.OnNoSpare != OnNoSpareFreeSlots && c.OnNoSpare != OnNoSpareAbort {
		return bad("unknown on-no-spare policy %d", int(c.OnNoSpare))
	}
	if c.MaxRestarts < 0 {
		return bad("max restarts %d is negative", c.MaxRestarts)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"fail window", c.FailWindow}, {"suspect timeout", c.SuspectTimeout}, {"heartbeat timeout", c.HeartbeatTimeout}, {"hang timeout", c.HangTimeout}} {
		if d.v < 0 {
			return bad("%s %v is negative", d.name, d.v)
		}
	}
	if c.FailWindow == 0 {
		c.FailWindow = DefaultFailWindow
	}
	if c.SuspectTimeout == 0 {
		c.SuspectTimeout = DefaultSuspectTimeout
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.KillGrace < 0 {
		c.KillGrace = 0
	}
	return spare, nil
}

// room is how many ranks host h may run: its slots, or with
// oversubscription its MaxSlots (0 = no limit).
func (c *Config) room(h int) int {
	if c.Oversubscribe {
		return c.Hosts[h].MaxSlots
	}
	return c.Hosts[h].Slots
}

// fits reports whether host h, running n ranks, may take m more.
func (c *Config) fits(h, n, m int) bool {
	room := c.room(h)
	return room == 0 || n+m <= room
}

// MaxECShards is the most data and parity hosts a group may have
// (K+M): the codec works in GF(2^8).
const MaxECShards = 256

// validateLogs checks c.Logs, the log-only holders of diff mode under
// EC: one row per rank, each naming ranks of the world on distinct hosts
// other than the owner's own and its clear copy's holder's.
func (c *Config) validateLogs() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: log holders: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if !c.Diff || c.EC == nil {
		return bad("given, but the job is not run in diff mode under erasure coding")
	}
	if len(c.Logs) != c.World {
		return bad("%d rows in a world of %d", len(c.Logs), c.World)
	}
	for r, ls := range c.Logs {
		taken := []int{c.Assign[r]}
		if c.Holders != nil {
			for _, x := range c.Holders[r] {
				taken = append(taken, c.Assign[x])
			}
		}
		for _, x := range ls {
			if x < 0 || x >= c.World {
				return bad("rank %d's log holder %d is not a rank", r, x)
			}
			if slices.Contains(taken, c.Assign[x]) {
				return bad("rank %d's log holder %d is on host %s, which has the rank or another copy of its log", r, x, c.Hosts[c.Assign[x]].Name)
			}
			taken = append(taken, c.Assign[x])
		}
	}
	return nil
}

// validateEC checks c.EC against Hosts and Assign, as topology.PlanEC
// plans it: every host with ranks in exactly one group, no spare in any;
// each group K data and M parity hosts (the same K and M for every
// group, K+M <= MaxECShards), its hosts distinct, the data and parity
// hosts its hosts; K data groups of equal length that hold exactly the
// ranks on the group's hosts, every rank in one. Holders, if given, must
// be the clear copies' holders: for each rank not on its data host, that
// host's lowest rank.
func (c *Config) validateEC(spare []bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: erasure coding: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if len(c.EC) == 0 {
		return bad("no groups")
	}
	ranksOn := make([][]int, len(c.Hosts))
	for r, h := range c.Assign {
		ranksOn[h] = append(ranksOn[h], r) // ascending: r grows
	}
	inGroup := make([]int, len(c.Hosts))
	for h := range inGroup {
		inGroup[h] = -1
	}
	member := make([]int, c.World) // a rank's data group's data host, -1: in none yet
	for r := range member {
		member[r] = -1
	}
	k, m := len(c.EC[0].Data), len(c.EC[0].Parity)
	if k < 1 || m < 1 || k+m > MaxECShards {
		return bad("%d data and %d parity hosts per group; need at least 1 of each and at most %d in all", k, m, MaxECShards)
	}
	for gi, g := range c.EC {
		if len(g.Data) != k || len(g.Parity) != m {
			return bad("group %d has %d data and %d parity hosts; group 0 has %d and %d", gi, len(g.Data), len(g.Parity), k, m)
		}
		if len(g.Hosts) != k+m || len(g.DataGroups) != k {
			return bad("group %d has %d hosts and %d data groups for %d+%d", gi, len(g.Hosts), len(g.DataGroups), k, m)
		}
		for _, h := range g.Hosts {
			if h < 0 || h >= len(c.Hosts) {
				return bad("group %d names host %d; there are %d hosts", gi, h, len(c.Hosts))
			}
			if spare[h] || len(ranksOn[h]) == 0 {
				return bad("group %d has host %s, which runs no rank", gi, c.Hosts[h].Name)
			}
			if inGroup[h] >= 0 {
				return bad("host %s is in groups %d and %d, or twice in one", c.Hosts[h].Name, inGroup[h], gi)
			}
			inGroup[h] = gi
		}
		roles := slices.Concat(g.Data, g.Parity)
		slices.Sort(roles)
		hosts := slices.Sorted(slices.Values(g.Hosts))
		if !slices.Equal(roles, hosts) {
			return bad("group %d: data hosts %v and parity hosts %v are not its hosts %v", gi, g.Data, g.Parity, g.Hosts)
		}
		n := 0
		for x, dg := range g.DataGroups {
			if len(dg) == 0 || len(dg) != len(g.DataGroups[0]) {
				return bad("group %d: data group %d has %d ranks, data group 0 %d", gi, x, len(dg), len(g.DataGroups[0]))
			}
			for _, r := range dg {
				if r < 0 || r >= c.World {
					return bad("group %d: rank %d is not a rank", gi, r)
				}
				if member[r] >= 0 {
					return bad("rank %d is in two data groups", r)
				}
				if !slices.Contains(g.Hosts, c.Assign[r]) {
					return bad("group %d: rank %d runs on host %s, not one of the group's", gi, r, c.Hosts[c.Assign[r]].Name)
				}
				member[r] = g.Data[x]
				n++
			}
		}
		have := 0
		for _, h := range g.Hosts {
			have += len(ranksOn[h])
		}
		if n != have {
			return bad("group %d: its data groups hold %d ranks, its hosts run %d", gi, n, have)
		}
	}
	for h, rs := range ranksOn {
		if len(rs) > 0 && inGroup[h] < 0 {
			return bad("host %s runs ranks but is in no group", c.Hosts[h].Name)
		}
	}
	if c.Holders == nil {
		return nil
	}
	for r, hs := range c.Holders {
		d := member[r]
		want := []int{ranksOn[d][0]}
		if c.Assign[r] == d {
			want = nil
		}
		if !slices.Equal(hs, want) {
			return bad("rank %d's clear copy is held by %v; its data host %s keeps it (%v)", r, hs, c.Hosts[d].Name, want)
		}
	}
	return nil
}
