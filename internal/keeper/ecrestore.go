package keeper

// Recovery by decode, bound to the hosts (ECHECK §III-B; PROTOCOL.md
// "Restore"): the Tier-2 restore of a rank whose replicated regions have
// no copy left in the clear (its own host and its data host are both
// gone), rebuilt on the restoring host from K other shards of its
// erasure-coded stripe at step G. ecdecode.go is the decoder; this file
// finds the stripe's shards in the current placement and binds the
// decoder's sources to them.
//
// Where the shards are. The restoring rank r is member x of stripe i of
// group g (Placement.EC). The lost member's committed table (its regions,
// sizes and CRC32Cs, in shard order) and the stripe length L (the longest
// member's shard) come from the parity rows: each complete row of step G
// names its K members with their tables (ecGet). The rows are asked
// first, all M in parallel; the rows that answer must agree on every
// member's rank, length and table (not on the generation and label of
// their shares: G is final, its shares the same under every label, and
// a row's generation moves on when a member of a newer generation
// confirms its share), and a row that disagrees with the most rows that
// agree is not a source (on a tie, the lowest row's answer is taken).
// The sources are then:
//
//   - each other data member m: its shard at G (getRange) from m's own
//     slot on m's host, else from the copy the placement's Source names
//     for m (Opt, when m itself restores from a copy), else from m's
//     clear copy's holder; the candidates are tried in that order, the
//     next when one fails, and a candidate whose table is not the one the
//     parity rows name for m is not used;
//   - each agreeing parity row j: its bytes at G (ecGet) from the row's
//     parity holder rank on Parity[j], checked to name the same members.
//
// Shards on this host are read through the local functions
// (Keeper.shardRange, parityStore.read), the others over the replication
// links. A source on a host that is gone fails at the link (the failure
// is reported to Config.LinkFailed, as the replicator's are, so that
// the launcher learns of the host) and the decoder drops it.
//
// Trust: as the decoder's. The bytes of every source are checked only by
// the CRC32Cs of the lost rank's committed table, which the parity rows
// carry from the owner's commit; nothing else is believed.
//
// Several lost ranks of one stripe decode independently (each on its own
// restoring host, from the shards that survive), and none of them reads
// the others' shards: a member that is itself being restored has no
// usable source until its restore is committed.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// decodeRemote rebuilds this rank's replicated regions at step g into
// views (by region name: the staged slot's) from its erasure-coded
// stripe under placement pl. It returns nil only when every view holds
// the bytes the rank committed at g (each region's CRC32C checked); an
// error wrapping ErrUnrecoverable when the stripe cannot give them
// (fewer than K usable shards, none of the parity rows answering, or no
// K of them rebuilding the committed CRC32Cs), except one wrapping
// errNoRoom instead when shards refused for want of room in their hosts'
// reserves would make K again (decodeMember): a retry may decode.
func (s *service) decodeRemote(ctx context.Context, g int64, pl *placement, views map[string][]byte) error {
	_, err := s.decodeAt(ctx, g, pl, views)
	return err
}

// decodeAt is decodeRemote at step g, which also returns the rank's
// committed table of g as the parity rows name it (its regions, sizes and
// CRC32Cs, in shard order), which the views were checked against. In
// diff mode under EC, g is a base step (the job's H), and the member
// shards at g are kept on their data hosts (Keeper.shardRange).
func (s *service) decodeAt(ctx context.Context, g int64, pl *placement, views map[string][]byte) ([]tableEntry, error) {
	if pl.ec == nil {
		return nil, errors.New("decode: this job has no erasure coding")
	}
	pos, ok := pl.ec.pos[s.rank]
	if !ok {
		return nil, fmt.Errorf("decode: rank %d is in no erasure-coding group", s.rank)
	}
	k, m := pl.ec.k, pl.ec.m
	members := pl.ec.members(pos.group, pos.stripe)
	rows := pl.ec.rows[pos.group]

	// The rows' members, all rows at once.
	answers := make([][]ecMember, m)
	rowErrs := make([]error, m)
	var wg sync.WaitGroup
	for j := range rows {
		wg.Go(func() {
			ms, err := s.readRow(ctx, pl, pos, j, g, 0, nil)
			if err == nil {
				err = checkRowMembers(ms, members, g)
			}
			answers[j], rowErrs[j] = ms, err
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	agree := agreeingRows(answers)
	if len(agree) == 0 {
		return nil, fmt.Errorf("%w: rank %d (member %d of stripe %d of group %d): no parity row of step %d answers: %w",
			ErrUnrecoverable, s.rank, pos.x, pos.stripe, pos.group, g, errors.Join(rowErrs...))
	}
	ref := answers[agree[0]]
	var shard int64
	for _, mb := range ref {
		shard = max(shard, mb.length)
	}
	sources := make([]shardSource, k+m)
	for x, owner := range members {
		if x == pos.x {
			continue
		}
		sources[x] = &memberSource{s: s, owner: owner, step: g, want: ref[x].table, cands: s.shardCandidates(pl, owner)}
	}
	var why []error
	for j := range rows {
		if !slices.Contains(agree, j) {
			if rowErrs[j] == nil {
				rowErrs[j] = fmt.Errorf("its members' shards (lengths, tables) differ from those of rows %v", agree)
			}
			why = append(why, fmt.Errorf("parity row %d: %w", j, rowErrs[j]))
			continue
		}
		sources[k+j] = shardSourceFunc(func(ctx context.Context, off int64, dst []byte) error {
			ms, err := s.readRow(ctx, pl, pos, j, g, off, dst)
			if err == nil && !slices.EqualFunc(ms, ref, sameShard) {
				err = fmt.Errorf("parity row %d changed members while it was read", j)
			}
			return err
		})
	}
	// The decoder's buffers are reserved before it allocates them
	// (ecrestore_mem.go); decodeMember returns once no read writes them.
	hold := s.h.store.newHold()
	defer hold.release()
	if err := hold.grow(decodeBufBytes(k, m, ref[pos.x].table, 0), "the decode's chunk buffers"); err != nil {
		return nil, fmt.Errorf("rank %d: %w", s.rank, err)
	}
	err := decodeMember(ctx, ecDecode{codec: pl.ec.codec, lost: pos.x, shard: shard, sources: sources, table: ref[pos.x].table, views: views})
	if err != nil && len(why) > 0 && (errors.Is(err, ErrUnrecoverable) || errors.Is(err, errNoRoom)) {
		// Why the other rows were not sources: as much the decode's
		// failure as its own sources'.
		return nil, fmt.Errorf("%w (and %w)", err, errors.Join(why...))
	}
	if err != nil {
		return nil, err
	}
	return slices.Clone(ref[pos.x].table), nil
}

// readRow reads bytes [off, off+len(dst)) of parity row j of the stripe
// at pos at step, from its parity holder rank (here, or over the link),
// and returns the row's members.
func (s *service) readRow(ctx context.Context, pl *placement, pos ecPos, j int, step, off int64, dst []byte) ([]ecMember, error) {
	rp := pl.ec.rows[pos.group][j]
	if rp.vacant() {
		return nil, fmt.Errorf("%w: parity row %d of group %d is vacant (its host %d runs no rank)", errNoRow, j, pos.group, rp.host)
	}
	if rp.host == s.h.cfg.Host {
		return s.h.parity.read(pos.group, pos.stripe, j, step, off, dst)
	}
	ms, err := s.h.links.ecGet(ctx, rp.host, rp.holder, pos.group, pos.stripe, j, step, off, dst)
	s.noteLink(ctx, rp.host, err)
	return ms, err
}

// noteLink reports a failure of the link to host (not a refusal) to
// Config.LinkFailed.
func (s *service) noteLink(ctx context.Context, host int, err error) {
	if le, ok := errors.AsType[*linkError](err); ok && ctx.Err() == nil {
		s.h.linkFailed(host, le)
	}
}

// checkRowMembers checks a row's members against the stripe's: K of
// them, member x being rank members[x].
func checkRowMembers(ms []ecMember, members []int, step int64) error {
	if len(ms) != len(members) {
		return fmt.Errorf("the row of step %d has %d members, the stripe %d", step, len(ms), len(members))
	}
	for x, mb := range ms {
		if mb.rank != members[x] {
			return fmt.Errorf("the row of step %d has rank %d as member %d, the stripe rank %d", step, mb.rank, x, members[x])
		}
	}
	return nil
}

// agreeingRows returns the rows (indices of answers; nil: no answer) that
// agree with the most others on every member's shard (length and table:
// sameShard); on a tie, those that agree with the lowest such row.
func agreeingRows(answers [][]ecMember) []int {
	var best []int
	for _, a := range answers {
		if a == nil {
			continue
		}
		var with []int
		for i, b := range answers {
			if b != nil && slices.EqualFunc(a, b, sameShard) {
				with = append(with, i)
			}
		}
		if len(with) > len(best) {
			best = with
		}
	}
	return best
}

// sameShard reports whether two rows name the same shard of a member:
// the same rank, length and table (its regions' committed CRC32Cs). Their
// generation and label may differ: the step restored is G, final, whose
// shares are the same under every label, and a row's generation moves on
// when a member of a newer generation confirms its share (ecHas), even
// while the row is read.
func sameShard(a, b ecMember) bool {
	return a.rank == b.rank && a.length == b.length && slices.Equal(a.table, b.table)
}

// shardLoc is where a copy of a member's shard may be read: holder rank
// holder's slot (holder == the owner) or clear copy, on host.
type shardLoc struct{ host, holder int }

// shardCandidates returns where owner's shard may be read under pl, in
// the order tried: its own slot, the copy its Source names, its clear
// copies' holders.
func (s *service) shardCandidates(pl *placement, owner int) []shardLoc {
	out := []shardLoc{{host: pl.hostOf(owner), holder: owner}}
	add := func(l shardLoc) {
		if l.host >= 0 && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	if src, ok := pl.sources[owner]; ok && !src.Decode {
		add(shardLoc{host: pl.hostOf(src.Opt), holder: src.Opt})
	}
	for _, hr := range pl.holdersOf(owner) {
		add(shardLoc{host: pl.hostOf(hr), holder: hr})
	}
	return out
}

// memberSource is a data member's shard, read from the first of its
// candidate copies that serves it: one that fails (its host gone, no copy
// of the step there, a table other than want) is left for the next.
// The decoder calls readShard one call at a time.
type memberSource struct {
	s     *service
	owner int
	step  int64
	want  []tableEntry // the member's table as the parity rows have it
	cands []shardLoc
	cur   int     // the candidate in use
	errs  []error // why the ones before it were left
}

func (ms *memberSource) readShard(ctx context.Context, off int64, dst []byte) error {
	for ms.cur < len(ms.cands) {
		c := ms.cands[ms.cur]
		var t []tableEntry
		var err error
		if c.host == ms.s.h.cfg.Host {
			t, err = ms.s.h.shardRange(ms.owner, c.holder, ms.step, off, dst)
		} else {
			t, err = ms.s.h.links.getRange(ctx, c.host, c.holder, ms.owner, ms.step, off, dst)
			ms.s.noteLink(ctx, c.host, err)
		}
		if err == nil && !slices.Equal(t, ms.want) {
			err = fmt.Errorf("its table %v is not the one of the parity rows %v", t, ms.want)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		what := "its slot"
		if c.holder != ms.owner {
			what = fmt.Sprintf("its copy at rank %d", c.holder)
		}
		ms.errs = append(ms.errs, fmt.Errorf("rank %d's shard from %s on host %d: %w", ms.owner, what, c.host, err))
		ms.cur++
	}
	return cmp.Or(errors.Join(ms.errs...), fmt.Errorf("no copy of rank %d's shard", ms.owner))
}
