package keeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
)

// The owner's erasure-coding pipeline (ec.go): a committed step's shares
// of the parity rows of its stripe, computed straight from the slot's
// views and sent to the rows' hosts.
//
// The shard (the replicated regions, in order) is cut into chunks of
// ecChunkSize bytes, each within one region. For each chunk, block by
// block, the pipeline reads the block from the slot once, copying it into
// a private buffer while it computes its CRC32C and the M shares, and
// each share's CRC32C (sent with the chunk, and combined into the whole
// share's, which ecCommit carries): ckpt.Codec.ShareChecked. So the shares are of exactly
// the bytes whose CRC32C is checked at the end against the CRC32Cs of the
// commit, whatever writes into the slot meanwhile. Two sets of share
// buffers alternate: chunk c+1 is encoded while the M senders, one per
// row, each on its own link, send chunk c.
//
// The bytes encoded not being the commit's is a corrupt state of the
// step, whether the slot still differs from its commit or matches it
// again (a write taken back): shares of those bytes may be in the rows,
// which cannot take a member's share out again (ecstore.go), so no
// resend can make the rows right under this label. The rank fails
// (*CorruptError); the job's roll back to G relabels the step. The same
// holds when a row says it holds other bytes of the share than the ones
// sent (failShare): an earlier encoding of the step, cut short before its
// end was checked, read bytes that were not the commit's.

// ecBlock is how many bytes the encoder takes at a time: small enough
// that the data block and its shares are still in the core's cache when
// they are checksummed.
const ecBlock = 128 << 10

// ecChunkSize is the bytes of one ecChunk request (a multiple of 64; a
// variable so that tests cut shards into many chunks).
var ecChunkSize = 4 << 20

// ecBufs are a replicator's share buffers, kept from one step to the
// next: two sets of M buffers of ecChunkSize bytes, and the encoder's
// copy of the block it encodes; and the encode stage's counters.
type ecBufs struct {
	sets [2][][]byte
	blk  []byte
	// The time the encoder spent encoding (shares and CRC32Cs, not
	// waiting for a buffer set) and the shard bytes it encoded: the
	// pipeline's own throughput, whatever the links', for benchmarks.
	encodeNS, encoded atomic.Int64
}

func (b *ecBufs) get(m int) [2][][]byte {
	if len(b.blk) != ecBlock {
		b.blk = make([]byte, ecBlock)
	}
	for i := range b.sets {
		if len(b.sets[i]) != m || len(b.sets[i][0]) != ecChunkSize {
			b.sets[i] = make([][]byte, m)
			for j := range b.sets[i] {
				b.sets[i][j] = make([]byte, ecChunkSize)
			}
		}
	}
	return b.sets
}

// ecJob is one chunk's shares, in set set, for the senders.
type ecJob struct {
	set  int
	off  int64 // in the shard
	n    int
	crcs []uint32 // each row's CRC32C of its share's n bytes
}

// ecSend sends step (in committed slot slot, whose replicated regions are
// t and data; the slot stays committed meanwhile) to the parity targets
// to, each a row of the rank's stripe, asking first those it knows
// nothing of (known[i] false) whether they have the share. gen and epoch
// label the shares. It returns each target's error, their join, and the
// share bytes sent. A *CorruptError if the bytes encoded are not the
// commit's, or a row holds other bytes of the share than the ones sent
// (then no row is told the share is in). A row that has no room for the
// share is reported as a failed link (Keeper.linkFailed), as a replica
// holder that has none closes the link.
func (r *replicator) ecSend(ctx context.Context, step int64, slot int, gen, epoch uint64, t []tableEntry, data [][]byte, to []holderKey, known []bool) ([]error, error, int64) {
	return r.ecSendLanes(ctx, step, slot, 0, gen, epoch, t, data, to, known, nil)
}

// ecSendLanes is ecSend on the links' lanes from lanes on. lanes is the first lane of the links the shares go on (linkKey): 0 in
// full mode; in diff mode under EC a base's shares go beside the
// differentials (lane 0), so that a slow row does not hold them up. slot
// is -1 when data is a snapshot already checked against t (diff mode
// under EC): bytes encoded that differ from t are then the snapshot's
// memory changing, a *CorruptError too. pace, if not nil, paces the
// encoder (diff mode under EC: a base's shares over the refresh's
// window, sharePace): each chunk is encoded only once pace allows the
// shard's bytes up to its end. The chunks are cut as without it (a row
// compares a resent chunk with the one that came: memberShare.chunkSum),
// so a retry goes unpaced up to what pace allows already. Full mode
// passes nil: there every step is a base, and G waits for it.
func (r *replicator) ecSendLanes(ctx context.Context, step int64, slot, lanes int, gen, epoch uint64, t []tableEntry, data [][]byte, to []holderKey, known []bool, pace *sharePace) ([]error, error, int64) {
	s := r.s
	errs := make([]error, len(to))
	fail := func(err error) ([]error, error, int64) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs, err, 0
	}
	ec := s.h.place().ec
	var pos ecPos
	ok := ec != nil
	if ok {
		pos, ok = ec.pos[s.rank]
	}
	if !ok {
		return fail(fmt.Errorf("rank %d is in no erasure-coding group", s.rank))
	}
	shardLen := int64(tableBytes(t))
	hb := int64(noStep) // the H the rows keep the buffer of (ecHdr): diff mode under EC only
	if s.h.place().ecDiff() {
		hb = s.h.H()
	}
	hdr := func(k holderKey, kind byte) (linkHdr, ecHdr) {
		return linkHdr{kind: kind, owner: s.rank, holder: k.rank, step: step, gen: gen},
			ecHdr{group: pos.group, stripe: pos.stripe, row: k.row - 1, member: pos.x, n: shardLen, epoch: epoch, hb: hb}
	}
	linkFailed := func(host int, err error) {
		if ctx.Err() != nil {
			return
		}
		if le, ok := errors.AsType[*linkError](err); ok {
			s.h.linkFailed(host, le)
		} else if refusedAs(err, failNoRoom) {
			s.h.linkFailed(host, err)
		}
	}
	// differs returns a *CorruptError if a row refused the share as
	// other bytes than those it holds.
	differs := func() *CorruptError {
		for i, err := range errs {
			if refusedAs(err, failShare) {
				return &CorruptError{Rank: s.rank, Step: step, Detail: fmt.Sprintf("parity row %d on host %d holds other bytes of the rank's share than those of its commit, encoded before (%v)", to[i].row-1, to[i].host, err)}
			}
		}
		return nil
	}

	// Ask the rows known nothing of.
	need := make([]bool, len(to))
	var wg sync.WaitGroup
	for i, k := range to {
		need[i] = true
		if known[i] {
			continue
		}
		wg.Go(func() {
			h, e := hdr(k, kindECHas)
			if s.h.links.ecAckedLane(ctx, k.host, lanes, h, t, e, nil) == nil {
				need[i] = false
			}
		})
	}
	wg.Wait()
	var rows []int // indices into to of the rows to send to
	for i := range to {
		if need[i] {
			rows = append(rows, i)
		}
	}
	if len(rows) == 0 {
		return errs, nil, 0
	}

	// The senders: one per row, each streams the chunks in order.
	nchunks := 0
	for _, d := range data {
		nchunks += (len(d) + ecChunkSize - 1) / ecChunkSize
	}
	bufs := r.ec.get(ec.m)
	var inflight [2]sync.WaitGroup
	jobs := make([]chan ecJob, len(rows))
	shareCRC := make([]uint32, len(rows)) // of each row's whole share so far
	var sent atomic.Int64
	var senders sync.WaitGroup
	var failed atomic.Int32
	for ri, i := range rows {
		jobs[ri] = make(chan ecJob, 2)
		k := to[i]
		// A host that keeps several rows of the stripe gets each on a
		// lane of its own: the encoder waits for every row's sender, so
		// two rows' streams on one link would wait for each other.
		lane := lanes
		for _, x := range rows[:ri] {
			if to[x].host == k.host {
				lane++
			}
		}
		senders.Go(func() {
			errs[i] = r.ecStream(ctx, k, lane, jobs[ri], nchunks, func(job ecJob) (linkHdr, ecHdr, []byte) {
				h, e := hdr(k, kindECChunk)
				e.off, e.crc = job.off, job.crcs[k.row-1]
				return h, e, bufs[job.set][k.row-1][:job.n]
			}, func(job ecJob) {
				inflight[job.set].Done()
			}, &sent)
			if errs[i] != nil {
				failed.Add(1)
				linkFailed(k.host, errs[i])
			}
		})
	}
	// The encoder, here.
	if testHookSlotRead != nil {
		testHookSlotRead(s)
	}
	sums := make([]uint32, len(t)) // of the data encoded, by region
	sub := make([][]byte, ec.m)
	blk := r.ec.blk
	set := 0
	var off int64
encode:
	for ri, d := range data {
		for o := 0; o < len(d); o += ecChunkSize {
			if ctx.Err() != nil {
				break encode
			}
			if int(failed.Load()) == len(rows) {
				// Every row failed: the rest is only checked, so that
				// chunks sent already are judged.
				sums[ri] = crc32c.Update(sums[ri], d[o:])
				break
			}
			n := min(ecChunkSize, len(d)-o)
			if pace != nil && pace.wait(ctx, off+int64(o+n)) != nil {
				break encode // ctx ended: judged below
			}
			inflight[set].Wait() // its last chunk is sent
			began := time.Now()
			crcs := make([]uint32, ec.m) // the job's: a sender reads it after the next chunk's encoding began
			var hook func(int, bool)
			if testHookECBlock != nil {
				at := off + int64(o)
				hook = func(a int, read bool) { testHookECBlock(s, at+int64(a), read) }
			}
			sums[ri] = ecEncodeChunk(ec.codec, pos.x, blk, d[o:o+n], bufs[set], sub, crcs, sums[ri], hook)
			for ri, i := range rows {
				j := to[i].row - 1
				shareCRC[ri] = ckpt.CombineCRC32C(shareCRC[ri], crcs[j], int64(n))
			}
			r.ec.encodeNS.Add(int64(time.Since(began)))
			r.ec.encoded.Add(int64(n))
			inflight[set].Add(len(rows))
			for ri := range rows {
				jobs[ri] <- ecJob{set: set, off: off + int64(o), n: n, crcs: crcs}
			}
			set ^= 1
		}
		off += int64(len(d))
	}
	for ri := range rows {
		close(jobs[ri])
	}
	senders.Wait()
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	// Every byte was encoded, or checked after every row failed.
	for i, e := range t {
		if sums[i] != e.sum {
			// The bytes encoded are not the committed ones: corrupt,
			// even if the slot matches its commit again.
			var ce *CorruptError
			if slot >= 0 {
				ce = s.verifySlot(slot, step)
			}
			if ce == nil {
				ce = &CorruptError{Rank: s.rank, Step: step, Region: e.name, Sum: e.sum, Got: sums[i]}
			}
			e, _, _ := fail(ce)
			return e, ce, sent.Load()
		}
	}
	if ce := differs(); ce != nil {
		e, _, _ := fail(ce)
		return e, ce, sent.Load()
	}
	if int(failed.Load()) == len(rows) {
		return errs, errors.Join(errs...), sent.Load()
	}
	// The rows that took every byte of the share get its commit.
	for ri, i := range rows {
		k := to[i]
		if errs[i] != nil {
			continue
		}
		wg.Go(func() {
			h, e := hdr(k, kindECCommit)
			e.crc = shareCRC[ri]
			errs[i] = s.h.links.ecAckedLane(ctx, k.host, lanes, h, t, e, nil)
			linkFailed(k.host, errs[i])
		})
	}
	wg.Wait()
	if ce := differs(); ce != nil {
		e, _, _ := fail(ce)
		return e, ce, sent.Load()
	}
	return errs, errors.Join(errs...), sent.Load()
}

// ecEncodeChunk is the encoder's work on one chunk, piece: block by
// block (ecBlock), member x's M shares of the block into shares[j][a:b]
// (sub is scratch of M entries), with the block's bytes added to sum (the
// CRC32C of the data read so far, returned) and each share's to crcs[j]
// (zero for a new chunk), the block copied into blk as it is read
// (ckpt.Codec.ShareChecked: each byte of the slot read once, so the
// shares are of the bytes checked; where the processor allows, the
// CRC32Cs folded in as the shares are computed, without reading them
// again). hook, if not nil, is called with the block's offset in piece
// before the block is read (false) and once it is (true).
func ecEncodeChunk(codec *ckpt.Codec, x int, blk, piece []byte, shares, sub [][]byte, crcs []uint32, sum uint32, hook func(a int, read bool)) uint32 {
	for a := 0; a < len(piece); a += ecBlock {
		b := min(a+ecBlock, len(piece))
		if hook != nil {
			hook(a, false)
		}
		for j := range sub {
			sub[j] = shares[j][a:b]
		}
		var err error
		if sum, err = codec.ShareChecked(piece[a:b], x, sub, blk, sum, crcs); err != nil {
			panic(err) // the layout's code and the buffers agree by construction
		}
		if hook != nil {
			hook(a, true)
		}
	}
	return sum
}

// refusedAs says whether err is a refusal of the other host for reason
// why (failShare, failNoRoom, ...).
func refusedAs(err error, why uint32) bool {
	re, ok := errors.AsType[*remoteError](err)
	return ok && re.why == why
}

// ecStream sends the chunks of jobs to parity target k on one request of
// lane lane of its link (linkKey), without waiting for each answer before the next chunk: a
// reader takes the answers (at most n) as they come while the chunks are
// written, so that the parity host receives chunk c+1 while it checks
// and XORs chunk c. frame gives a chunk's request; written is called
// once a job's bytes are written (or skipped after a failure): its
// buffer is free again. sent counts the bytes acknowledged. It returns
// the first failure: a refusal, the link's, or ctx's.
func (r *replicator) ecStream(ctx context.Context, k holderKey, lane int, jobs <-chan ecJob, n int, frame func(ecJob) (linkHdr, ecHdr, []byte), written func(ecJob), sent *atomic.Int64) error {
	s := r.s
	var streamed bool
	err := s.h.links.doLane(ctx, k.host, s.rank, lane, func(c net.Conn) error {
		streamed = true
		expect := make(chan ecJob, n)
		var refused error
		done := make(chan error, 1)
		go func() {
			// Every answer is read, refusals too, so that the link stays
			// in step; a broken link ends the writer's writes.
			for job := range expect {
				a, err := readAnswer(c)
				if _, ok := errors.AsType[*remoteError](err); ok {
					refused = cmp.Or(refused, err)
					continue
				}
				if err == nil && (a.kind != kindAck || a.owner != s.rank || a.holder != k.rank) {
					err = fmt.Errorf("unexpected answer kind %#x for rank %d", a.kind, a.owner)
				}
				if err != nil {
					c.SetDeadline(time.Unix(1, 0))
					for range expect {
					}
					done <- err
					return
				}
				sent.Add(int64(job.n))
			}
			done <- refused
		}()
		var werr error
		for job := range jobs {
			if werr == nil {
				h, e, d := frame(job)
				if werr = writeEC(c, h, nil, e, d); werr == nil {
					expect <- job
				}
			}
			written(job)
		}
		close(expect)
		rerr := <-done
		if _, ok := errors.AsType[*remoteError](rerr); ok && werr == nil {
			return rerr
		}
		return cmp.Or(werr, rerr)
	})
	if !streamed {
		for job := range jobs {
			written(job)
		}
	}
	return err
}

// testHookECBlock, if set (by tests), is called by the encoder before it
// reads the block of the shard at off (read false) and once the block is
// done (read true): copied, its shares made and every CRC32C taken, by
// one ckpt.Codec.ShareChecked, so no hook falls between the block's read
// and its coding.
var testHookECBlock func(s *service, off int64, read bool)
