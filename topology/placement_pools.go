package topology

// A pool is where one try looks for an owner's holders: the members of
// the owner's super-domain (the whole group, or the owner's switch or
// rack for an exact try), divided into sub-domains that holders must not
// share with the owner or each other. Sub-domains keep the order of their
// first member along the ring, members their ring order.
type pool struct {
	subs []*subdomain
	// next[i] leads to the first sub-domain at or after i (cyclically)
	// that may still have a member under the load cap; open counts them.
	next []int
	open int
}

type subdomain struct {
	members []int // ranks, in ring order
	cursor  int   // round-robin position: the next member to give
	// room: members still under the load cap, in ring order from
	// cursor; a member is dropped when found full (loads only grow).
	room []int
}

// tryPools indexes one try's pools for a group: where each member stands.
type tryPools struct {
	pools []*pool
	where map[int]poolPos // by rank; members without a key have none
}

type poolPos struct{ pool, sub int }

// buildPools divides group g for the try (lv, exact).
func (pl *placer) buildPools(g []int, lv Level, exact bool) *tryPools {
	d := pl.d
	// keys returns a member's super- and sub-domain keys; ok is false
	// when the member cannot take part (a label the try needs is missing).
	keys := func(r int) (super, sub int64, ok bool) {
		h := pl.hostOf[r]
		rack, sw := int64(d.rack[h]), int64(d.sw[h])
		switch {
		case lv == LevelRack:
			return 0, rack, rack >= 0
		case lv == LevelSwitch && exact:
			return rack, sw, sw >= 0
		case lv == LevelSwitch:
			return 0, sw, sw >= 0
		case exact: // LevelHost, exactly: same rack and switch
			return (rack+1)<<32 | (sw + 1), int64(h), true
		default:
			return 0, int64(h), true
		}
	}
	tp := &tryPools{where: make(map[int]poolPos, len(g))}
	superIdx := map[int64]int{}
	subIdx := map[[2]int64]int{}
	for _, r := range g {
		super, sub, ok := keys(r)
		if !ok {
			continue
		}
		pi, seen := superIdx[super]
		if !seen {
			pi = len(tp.pools)
			superIdx[super] = pi
			tp.pools = append(tp.pools, &pool{})
		}
		po := tp.pools[pi]
		si, seen := subIdx[[2]int64{super, sub}]
		if !seen {
			si = len(po.subs)
			subIdx[[2]int64{super, sub}] = si
			po.subs = append(po.subs, &subdomain{})
		}
		sd := po.subs[si]
		sd.members = append(sd.members, r)
		tp.where[r] = poolPos{pi, si}
	}
	for _, po := range tp.pools {
		po.next = make([]int, len(po.subs))
		for i, sd := range po.subs {
			po.next[i] = i
			sd.room = append([]int(nil), sd.members...)
		}
		po.open = len(po.subs)
	}
	return tp
}

// findOpen returns the first sub-domain at or after i (cyclically) that
// may have room, or -1 if none has.
func (po *pool) findOpen(i int) int {
	if po.open == 0 {
		return -1
	}
	root := i
	for po.next[root] != root {
		root = po.next[root]
	}
	for po.next[i] != root { // path compression
		i, po.next[i] = po.next[i], root
	}
	return root
}

func (po *pool) close(i int) {
	po.next[i] = (i + 1) % len(po.subs)
	po.open--
}

// take gives the next member of sub-domain sd in round-robin order: when
// capped, only one holding fewer than k replicas (-1 if none is left).
func (sd *subdomain) take(load []int, k int, capped bool) int {
	if !capped {
		r := sd.members[sd.cursor%len(sd.members)]
		sd.cursor++
		return r
	}
	for len(sd.room) > 0 {
		i := sd.cursor % len(sd.room)
		r := sd.room[i]
		if load[r] < k {
			sd.cursor = i + 1
			return r
		}
		sd.room = append(sd.room[:i], sd.room[i+1:]...) // full for good
	}
	return -1
}

// pick looks for K holders for owner in the try's pools: one member from
// each of the first K sub-domains after the owner's, in the owner's pool,
// skipping (when capped) members that hold K replicas already. It leaves
// them in pl.picked and reports whether it found K.
func (pl *placer) pick(tp *tryPools, owner int, capped bool) bool {
	pl.picked = pl.picked[:0]
	at, ok := tp.where[owner]
	if !ok {
		return false
	}
	po := tp.pools[at.pool]
	n := len(po.subs)
	// Walk the sub-domains after the owner's, cyclically, once: dist,
	// the distance from the owner's, must grow at every step.
	i, lastDist := at.sub, 0
	for len(pl.picked) < pl.k {
		next := (i + 1) % n
		if capped {
			if next = po.findOpen(next); next < 0 {
				break
			}
		}
		dist := (next - at.sub + n) % n
		if dist <= lastDist {
			break // back at the owner's sub-domain
		}
		i, lastDist = next, dist
		r := po.subs[next].take(pl.p.Load, pl.k, capped)
		if r < 0 {
			po.close(next) // every member is full
			continue
		}
		pl.picked = append(pl.picked, r)
	}
	return len(pl.picked) == pl.k
}
