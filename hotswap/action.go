package hotswap

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/topology"
)

// An Action is something the caller must do, in the order given. The set
// is closed: only this package's types implement it.
type Action interface {
	action()
	String() string
}

// StopRanks: send Signal to every rank, SIGKILL after Grace.
type StopRanks struct {
	Signal syscall.Signal
	Grace  time.Duration
}

// KillAll: SIGKILL every rank now.
type KillAll struct{}

// Forward: pass Signal on to every rank (SIGUSR1, SIGUSR2).
type Forward struct{ Signal syscall.Signal }

// Restart: stop every rank and start it again in generation Gen, epoch
// Epoch, resuming from step G (G < 0: from the start).
type Restart struct {
	Gen, Epoch uint64
	G          int64
}

// Probe: host Host (Name) is suspected: ask its agent for a sign of life
// at once (a Heartbeat event clears the suspicion), rather than wait for
// its next heartbeat.
type Probe struct {
	Host int
	Name string
}

// Fence: host Host (Name) is lost: cut it off (close its agent's control
// stream, so that an agent still running kills its ranks and exits) and
// ignore its reports from now on. Its ranks are in no later epoch.
type Fence struct {
	Host int
	Name string
}

// Splice: host Lost is gone; its Ranks now run on host With (a spare, or
// a surviving host with free slots), from epoch Epoch on (the epoch this
// loss began: one step can lose several hosts, each in an epoch of its
// own). The caller starts them there.
type Splice struct {
	Epoch              uint64
	Lost, With         int
	LostName, WithName string
	Ranks              []int
	Spare              bool
}

// PublishEpoch: publish epoch Epoch with its rank → host table and
// replica holders (RankHost[r] is rank r's host, Holders[r] the ranks
// keeping copies of its optimizer shard). Under erasure coding
// (Config.EC) EC is the epoch's groups, each with the hosts that hold
// its places now (a replacement in the lost host's place), and Holders
// the clear copies' holders. In diff mode under EC (Config.Diff) Logs
// are every rank's log-only holders (a spare in a lost host's place in
// them too). The slices are the caller's.
type PublishEpoch struct {
	Epoch    uint64
	G        int64
	RankHost []int
	Holders  [][]int
	EC       []topology.ECGroup
	Logs     [][]int
	names    []string
}

// Source says where a rank restores its state from.
type Source struct {
	Rank int
	// Local: from its own host's slot (Tier-1). Otherwise the optimizer
	// shard and meta come from OptRank's copy on host OptHost and the
	// parameters from data-parallel peer ParamsRank on ParamsHost.
	Local      bool
	OptRank    int
	OptHost    int
	ParamsRank int
	ParamsHost int
	// Decode: no copy of the optimizer shard and meta survives in the
	// clear; they are rebuilt from the erasure code of the rank's stripe
	// (Config.EC), which the plan checked still has K valid shards.
	// OptRank and OptHost are then -1.
	Decode bool
}

// RestorePlan: every rank restores step G from its Source. With G < 0
// nothing was protected yet: every source is Local and means "start from
// the beginning".
type RestorePlan struct {
	Epoch   uint64
	G       int64
	Sources []Source // indexed by rank
	names   []string
}

// UnderProtected: these owners' optimizer shards have fewer copies than
// configured until the caller reports them [Replicated]. Epoch is the
// recovery epoch that left them so (the splice's or roll-back's that it
// follows; one step may begin several epochs).
//
// With Corrupt, the owners' copies failed their CRC32C in a restore of
// step Step: the owners count as re-protected only once they replicated a
// step after Step and G passed it (until then a holder may still keep
// the corrupt copy and answer that it has Step).
type UnderProtected struct {
	Epoch   uint64
	Owners  []int
	Corrupt bool
	Step    int64
}

// Protected: every shard has all its copies again.
type Protected struct{}

// Report: a line for the user.
type Report struct{ Msg string }

// Abort: the job stops with exit code Code; Msg says why. A StopRanks
// follows.
type Abort struct {
	Code int
	Msg  string
}

// Timeline is a recovery epoch's record: the times (since the job's
// start) at which it went through each stage; -1 where it did not.
type Timeline struct {
	Epoch      uint64
	Cause      string
	Detected   time.Duration
	Classified time.Duration
	Replaced   time.Duration // replacement chosen (-1: a restart in place)
	Published  time.Duration
	Restored   time.Duration
	Resumed    time.Duration
	Superseded bool // a later failure ended it
	Unfinished bool // the epoch is still under way ([Machine.OpenTimeline])
}

func (StopRanks) action()      {}
func (KillAll) action()        {}
func (Forward) action()        {}
func (Restart) action()        {}
func (Fence) action()          {}
func (Probe) action()          {}
func (Splice) action()         {}
func (PublishEpoch) action()   {}
func (RestorePlan) action()    {}
func (UnderProtected) action() {}
func (Protected) action()      {}
func (Report) action()         {}
func (Abort) action()          {}
func (Timeline) action()       {}

func (a StopRanks) String() string {
	return fmt.Sprintf("stop-ranks signal=%s grace=%v", SignalName(a.Signal), a.Grace)
}
func (KillAll) String() string   { return "kill-all" }
func (a Forward) String() string { return "forward signal=" + SignalName(a.Signal) }
func (a Restart) String() string {
	return fmt.Sprintf("restart gen=%d epoch=%d from=%d", a.Gen, a.Epoch, a.G)
}
func (a Fence) String() string { return "fence host=" + a.Name }
func (a Probe) String() string { return "probe host=" + a.Name }

func (a Splice) String() string {
	kind := "free-slots"
	if a.Spare {
		kind = "spare"
	}
	return fmt.Sprintf("splice lost=%s with=%s (%s) ranks=%s", a.LostName, a.WithName, kind, ints(a.Ranks))
}

func (a PublishEpoch) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "publish epoch=%d g=%d table=", a.Epoch, a.G)
	b.WriteString(table(a.RankHost, a.names))
	if a.Holders != nil {
		b.WriteString(" holders=")
		writeHolders(&b, a.Holders)
	}
	if a.EC != nil {
		b.WriteString(" ec=" + ecString(a.EC, a.names))
	}
	if a.Logs != nil {
		b.WriteString(" logs=")
		writeHolders(&b, a.Logs)
	}
	return b.String()
}

// table prints a rank → host table as host:ranks groups, hosts in order of
// first appearance.
func table(rankHost []int, names []string) string {
	var order []int
	by := map[int][]int{}
	for r, h := range rankHost {
		if _, ok := by[h]; !ok {
			order = append(order, h)
		}
		by[h] = append(by[h], r)
	}
	parts := make([]string, len(order))
	for i, h := range order {
		parts[i] = hostName(names, h) + ":" + ints(by[h])
	}
	return strings.Join(parts, " ")
}

func (a RestorePlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "restore epoch=%d g=%d", a.Epoch, a.G)
	var local []int
	for _, s := range a.Sources {
		if s.Local {
			local = append(local, s.Rank)
		}
	}
	if len(local) > 0 {
		b.WriteString(" local=" + ints(local))
	}
	for _, s := range a.Sources {
		if s.Decode {
			fmt.Fprintf(&b, " r%d<-decode,params:r%d@%s", s.Rank, s.ParamsRank, hostName(a.names, s.ParamsHost))
		} else if !s.Local {
			fmt.Fprintf(&b, " r%d<-opt:r%d@%s,params:r%d@%s", s.Rank, s.OptRank, hostName(a.names, s.OptHost), s.ParamsRank, hostName(a.names, s.ParamsHost))
		}
	}
	return b.String()
}

func (a UnderProtected) String() string {
	if a.Corrupt {
		return fmt.Sprintf("under-protected owners=%s corrupt-step=%d", ints(a.Owners), a.Step)
	}
	return "under-protected owners=" + ints(a.Owners)
}
func (Protected) String() string { return "protected" }
func (a Report) String() string  { return "report: " + a.Msg }
func (a Abort) String() string   { return fmt.Sprintf("abort code=%d: %s", a.Code, a.Msg) }
func (a Timeline) String() string {
	t := func(d time.Duration) string {
		if d < 0 {
			return "-"
		}
		return d.String()
	}
	s := fmt.Sprintf("timeline epoch=%d detected=%s classified=%s replaced=%s published=%s restored=%s resumed=%s",
		a.Epoch, t(a.Detected), t(a.Classified), t(a.Replaced), t(a.Published), t(a.Restored), t(a.Resumed))
	if a.Superseded {
		s += " superseded"
	}
	if a.Unfinished {
		s += " unfinished"
	}
	return s + " cause=" + strconv.Quote(a.Cause)
}

func hostName(names []string, h int) string {
	if h >= 0 && h < len(names) {
		return names[h]
	}
	return "h?" + strconv.Itoa(h)
}

// ints prints a sorted or unsorted list of ints, runs of consecutive
// values as a-b.
func ints(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(xs[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(xs[j]))
		}
		i = j + 1
	}
	return b.String()
}

// SignalName is a signal's name as people write it ("SIGKILL"), or
// "signal N" for one without a name here.
func SignalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP",
	syscall.SIGKILL: "SIGKILL", syscall.SIGSEGV: "SIGSEGV", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGILL: "SIGILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2", syscall.SIGPIPE: "SIGPIPE",
	syscall.SIGQUIT: "SIGQUIT",
}

// writeHolders writes holders as "rank:holders" pairs, space-separated.
func writeHolders(b *strings.Builder, holders [][]int) {
	for r, hs := range holders {
		if r > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(b, "%d:%s", r, ints(hs))
	}
}
