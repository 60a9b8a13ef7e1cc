package topology

import (
	"fmt"
	"strings"
)

// MapBy is a rank mapping policy, as mpirun's --map-by.
type MapBy int

const (
	// MapBySlot fills each host's slots before moving to the next host, so
	// the ranks on a host are consecutive.
	MapBySlot MapBy = iota
	// MapByNode places ranks round-robin, one per host per pass.
	MapByNode
)

// ParseMapBy parses a --map-by value: "slot" or "node" (any case).
func ParseMapBy(s string) (MapBy, error) {
	switch strings.ToLower(s) {
	case "slot":
		return MapBySlot, nil
	case "node":
		return MapByNode, nil
	}
	return 0, fmt.Errorf("%w %s: want slot or node", ErrBadMapBy, shorten(s))
}

// String returns "slot", "node", or "MapBy(N)" for other values.
func (m MapBy) String() string {
	switch m {
	case MapBySlot:
		return "slot"
	case MapByNode:
		return "node"
	}
	return fmt.Sprintf("MapBy(%d)", int(m))
}

// Assignment: rank -> host index (into the hosts slice given to MapRanks)
// and local rank on that host.
type Assignment struct{ Rank, Host, LocalRank int }

// MapOptions says how many ranks MapRanks places and how.
type MapOptions struct {
	NP            int   // number of ranks, 1 to 16,777,216
	By            MapBy // mapping policy
	Oversubscribe bool  // allow more ranks than slots (up to each host's MaxSlots)
}

// MapRanks places NP ranks on the non-spare hosts. Returns assignments indexed by rank.
//
// First each host's share is decided. If NP fits in the slots, by slot
// fills host 0's slots, then host 1's, and so on; by node gives one rank
// per host per pass, skipping hosts whose slots are full. If NP exceeds
// the slots, MapRanks fails with ErrTooManyRanks unless opt.Oversubscribe
// is set; then every host is filled to its Slots and the excess is dealt
// round-robin over the hosts, one per host per pass from host 0, skipping
// hosts that reached their MaxSlots (ErrTooManyRanks if every host has a
// MaxSlots and together they are too few).
//
// Then ranks are numbered: by slot, host by host in order, so each host's
// ranks are consecutive (as Open MPI does when oversubscribed too); by
// node, pass by pass over the hosts that still have ranks to receive.
// LocalRank is the index of a rank among its host's ranks in rank order.
//
// Spare hosts get no ranks. A non-spare host must have Slots >= 1 and
// MaxSlots 0 or >= Slots (ErrBadValue); if there is no non-spare host the
// error is ErrNoSlots.
func MapRanks(hosts []Host, opt MapOptions) ([]Assignment, error) {
	if opt.NP < 1 {
		return nil, fmt.Errorf("%w: %d requested; need at least 1", ErrBadNP, opt.NP)
	}
	if opt.NP > maxRanks {
		return nil, fmt.Errorf("%w: %d requested; at most %d supported", ErrBadNP, opt.NP, maxRanks)
	}
	if opt.By != MapBySlot && opt.By != MapByNode {
		return nil, fmt.Errorf("%w %v", ErrBadMapBy, opt.By)
	}
	var active []int // indices of non-spare hosts
	for i, h := range hosts {
		if h.Spare {
			continue
		}
		if h.Slots < 1 {
			return nil, fmt.Errorf("%w: host %d (%s) has %d slots; need at least 1", ErrBadValue, i, shorten(h.Name), h.Slots)
		}
		if h.MaxSlots < 0 || h.MaxSlots > 0 && h.MaxSlots < h.Slots {
			return nil, fmt.Errorf("%w: host %d (%s) has max_slots %d below its %d slots", ErrBadValue, i, shorten(h.Name), h.MaxSlots, h.Slots)
		}
		active = append(active, i)
	}
	if len(active) == 0 {
		return nil, fmt.Errorf("%w: none of the %d hosts can take ranks (spare hosts get none at start)", ErrNoSlots, len(hosts))
	}

	// Sums saturate above maxRanks: only their comparison with NP matters,
	// and when they are printed they are below NP.
	slots := make([]int, len(active))
	limits := make([]int, len(active)) // MaxSlots, 0 = none
	total, limitTotal, unlimited := 0, 0, false
	for k, i := range active {
		slots[k], limits[k] = hosts[i].Slots, hosts[i].MaxSlots
		total = min(total+min(slots[k], maxRanks+1), maxRanks+1)
		if limits[k] == 0 {
			unlimited = true
		}
		limitTotal = min(limitTotal+min(limits[k], maxRanks+1), maxRanks+1)
	}

	counts := make([]int, len(active))
	switch {
	case opt.NP <= total && opt.By == MapBySlot:
		left := opt.NP
		for k := range counts {
			counts[k] = min(slots[k], left)
			left -= counts[k]
		}
	case opt.NP <= total:
		deal(counts, slots, opt.NP)
	case !opt.Oversubscribe:
		return nil, fmt.Errorf("%w: %d ranks requested but only %d slots on %s; use --oversubscribe or add hosts",
			ErrTooManyRanks, opt.NP, total, plural(len(active), "host"))
	case !unlimited && opt.NP > limitTotal:
		return nil, fmt.Errorf("%w: %d ranks requested but max_slots allows only %d on %s",
			ErrTooManyRanks, opt.NP, limitTotal, plural(len(active), "host"))
	default:
		copy(counts, slots)
		deal(counts, limits, opt.NP-total)
	}

	out := make([]Assignment, opt.NP)
	rank := 0
	if opt.By == MapBySlot {
		for k, i := range active {
			for local := range counts[k] {
				out[rank] = Assignment{Rank: rank, Host: i, LocalRank: local}
				rank++
			}
		}
		return out, nil
	}
	live := make([]int, 0, len(active))
	for k := range active {
		if counts[k] > 0 {
			live = append(live, k)
		}
	}
	for pass := 0; len(live) > 0; pass++ {
		j := 0
		for _, k := range live {
			out[rank] = Assignment{Rank: rank, Host: active[k], LocalRank: pass}
			rank++
			if counts[k] > pass+1 {
				live[j] = k
				j++
			}
		}
		live = live[:j]
	}
	return out, nil
}

// deal adds n to counts round-robin, one per index per pass from index 0,
// skipping indices whose count reached limit (0 = no limit). The caller
// makes sure the limits leave room for n.
func deal(counts, limit []int, n int) {
	live := make([]int, 0, len(counts))
	for k := range counts {
		if limit[k] == 0 || counts[k] < limit[k] {
			live = append(live, k)
		}
	}
	for n > 0 && len(live) > 0 {
		j := 0
		for _, k := range live {
			if n == 0 {
				break
			}
			counts[k]++
			n--
			if limit[k] == 0 || counts[k] < limit[k] {
				live[j] = k
				j++
			}
		}
		live = live[:j]
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", what)
	}
	if strings.HasSuffix(what, "ch") || strings.HasSuffix(what, "s") || strings.HasSuffix(what, "x") {
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}
