// Package topology reads hostfiles and host lists, maps ranks onto the
// slots they describe, and makes every placement decision of fault
// tolerance: the parallel layout, who holds whose replicas, which hosts
// form erasure-coding groups, which spare replaces a lost host. It makes
// decisions and does no I/O, except for [ReadHostfile], which opens one
// file and hands it to [ParseHostfile].
//
// # Hostfiles
//
// A hostfile lists one host (or one Slurm node list) per line, followed by
// attributes:
//
//	# comment: '#' starts a comment anywhere on a line; blank lines are fine
//	node1 slots=4 max_slots=8   # Open MPI form
//	node2:4                     # MPICH form: ":N" gives the slots
//	node[03-06] slots=2 rack=r1 switch=s3
//	node7 spare                 # gorun: a spare host, never given ranks at start
//	[fd00::7]:2                 # IPv6 addresses are written in brackets
//
// The first field of a line is a host list in the same syntax as
// [ParseHostList] (comma-separated entries, each a host name, an IPv6
// address in brackets, or a Slurm node list, with an optional ":N"). Every
// host it names gets the line's attributes. The attributes are:
//
//   - slots=N: the number of slots, 1 to 1048576. A line without slots (and
//     without ":N") gives each host 1 slot. Giving both ":N" and slots= on one
//     line is an error.
//   - max_slots=N: a hard limit on ranks placed on the host even when
//     oversubscribing; at least the host's slots. Without it there is no limit.
//   - rack=NAME, switch=NAME: failure-domain labels. Labels use letters,
//     digits and - _ . : / and are at most 255 bytes.
//   - spare: the bare word; the host is held back as a spare.
//
// Attributes are key=value only (slots:4 is an error), keys are lower case,
// each key may appear once per line, and values may not be empty. Unknown
// keys and words are errors that name them.
//
// Host names are as written (compared byte for byte, so case matters): one
// or more dot-separated labels of letters, digits, '-' and '_', each 1 to 63
// bytes and neither starting nor ending with '-', 253 bytes in all. A name
// made only of digits and dots must be a valid dotted-quad IPv4 address.
// IPv6 addresses must be written in brackets, "[fd00::1]" or "[fd00::1]:4";
// the Host's Name is then the address without the brackets.
//
// A host named on several lines (or several times on one line) is merged
// as Open MPI does: its slots add up, and so do its max_slots, which must
// then be given on every line or on none. rack and switch may be given on
// any of its lines but must agree; spare must be given on all of them or
// on none. Conflicts are errors naming both lines. Hosts keep the order of
// their first appearance.
//
// To keep hostile input from exhausting memory, a line may be at most 64 KiB
// and a hostfile, host list or node list may name at most 1,000,000 hosts
// (counting repeats).
//
// # Slurm node lists
//
// [ExpandNodeList] expands Slurm's compressed form: "node[01-04,07],login"
// is node01, node02, node03, node04, node07 and login. A bracket holds
// comma-separated numbers and ranges lo-hi; numbers are zero-padded to the
// width of the written lower bound, so [08-10] gives 08, 09, 10 and [1-10]
// gives 1 to 10. Text may follow a bracket ("gpu[1-2]x") and a name may hold
// several brackets ("r[1-2]n[1-2]" is r1n1, r1n2, r2n1, r2n2: the leftmost
// bracket varies slowest). Duplicates are kept.
//
// # Mapping ranks
//
// [MapRanks] places ranks on the non-spare hosts, by slot (fill each host in
// turn, as mpirun --map-by slot) or by node (round-robin, one rank per host
// per pass, as mpirun --map-by node).
//
// # Layout
//
// [NewLayout] splits a world into TP × PP × DP in Megatron-LM's order
// (rank = tp + TP·(dp + DP·pp)); the ranks with equal tp and pp form a
// data-parallel group, the ring on which optimizer shards are replicated.
//
// # Replica placement
//
// [Place] gives every rank K replica holders in its data-parallel group
// (DEADPOOL §V-B), on hosts other than its own and each other's, so any K
// host failures leave a copy of every shard. Failure domains come from the
// hostfile's rack= and switch= labels; two hosts are known to be in
// different racks (switches) only when both are labelled and the labels
// differ. The CrossDomain policy spreads an owner and its holders over
// distinct racks, else switches, else hosts (DEADPOOL §V-C); SameDomain
// keeps holders as close as allowed, in the owner's switch and rack
// (TierCheck §3.1). Holders are taken round-robin within each domain and
// no rank holds more than K replicas while a peer in a suitable domain has
// room, so replica memory stays K shards per rank; the best-effort spread
// yields to that cap (reported in Placement.Shortfalls), a required
// separation (PlacementOptions.Require) does not. [ChooseSpare] picks the
// spare that keeps the separations the swap touches; [Placement.Lost] says
// which shards a set of failed hosts destroys, and [PLossBound] is
// DEADPOOL's bound D·p^(K+1).
//
// # Erasure-coding groups
//
// [PlanEC] cuts the hosts with ranks into groups of K data and M parity
// hosts (ECHECK): the data hosts are chosen by maximum overlap between the
// hosts' ranks and K equal data groups ([SelectDataNodes], §IV-B1), and the
// XOR reduction targets of each reduction group go to parity hosts where
// one is a member (§IV-B2). Any M failed hosts of a group lose nothing
// ([ECLoss]); [ECGroup.Replace] splices a spare into a group.
package topology
