package keeper

// Recovery by decode (ECHECK §III-B; DESIGN.md §5): the rebuilding of one
// lost rank's replicated regions, at the step being restored, from K other
// shards of its erasure-coded stripe, when neither its own slot nor the
// clear copy on its data host survived. (When either did, the restore is
// the ordinary Tier-2 one: restore.go.)
//
// A stripe is K data shards and M parity rows (ckpt.Codec). Data shard x
// is the bytes of member x's replicated regions at the step, in its
// committed table's order, back to back, padded with zeros to the stripe
// length L (the longest member's). Parity row j is the XOR of the K
// members' shares of row j. The lost member x's bytes are [0, Lx) of its
// shard, Lx = the sum of its table's sizes <= L.
//
// The decoder reads the shards through injected sources (shardSource),
// one per shard, which the caller binds to the network (a data member's
// own slot or its clear copy, a parity host's complete row) or, in tests,
// to memory. It reads K of them in parallel, chunk by chunk, with the
// next chunk's reads under way while the current chunk is rebuilt, and
// rebuilds each chunk straight into the lost rank's staged views: no copy
// of the whole state is ever staged.
//
// Trust. A source is trusted to fill what it is asked for or to fail: an
// error drops it for the rest of the decode (the decode goes on with
// another source in its place). Its bytes are not trusted: the sources
// are other hosts' memory, and a parity row is the XOR of K hosts' sends.
// The only proof of the result is the lost rank's committed table: each
// region's CRC32C (ckpt's, taken at commit) is checked over the rebuilt
// bytes as they are written. A region that does not match is rebuilt
// again from the next K-subset of the sources (the order below), so that
// a damaged source is stepped around without knowing which one it is.
// The table itself is trusted: the caller takes it from the parity rows,
// which took it from the owner's commit, and a wrong table can only make
// the decode fail, never pass wrong bytes (its CRC32Cs are what the bytes
// must match).
//
// Order of the K-subsets. The candidates are the available sources other
// than x, by index: the other data members first (x's own source, if
// any, is never read: that would be the direct restore), then the parity
// rows. A region is rebuilt first from the subset that rebuilt the
// previous region (the first region: the lexicographically first subset,
// data members first), then, if its CRC32C does not match, from each
// subset not yet tried for that region in lexicographic order. A region
// is given up, and the decode fails with ErrUnrecoverable, when every
// K-subset of the sources still usable gave a wrong CRC32C (at most
// C(K+M-1, K) rebuilds of it), or when fewer than K sources are left;
// with errNoRoom instead (a retry once there is room may decode) when
// sources were dropped for want of room (a host's reserve refused the
// answer) and, for too few sources, they would make K again with the
// usable ones.
// Regions verified before stay verified: only the failing region is
// rebuilt again.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
)

// ecDecodeChunk is the chunk a decode reads and rebuilds at a time by
// default: small enough that a 2+2 decode's working set for one chunk
// (the K sources' buffers as the kernel copied them in, the rebuilt
// bytes, then their CRC32C) stays in a core's L2 cache (2 MiB here), large
// enough that a read is one round trip per half a MiB. With
// BenchmarkECRestore (2+2, two decodes at once over loopback, 64 MiB per
// rank) 512 KiB took about a third less CPU than 4 MiB, and 128 KiB more
// than either (the requests' round trips).
const ecDecodeChunk = 512 << 10

// shardSource reads one shard of a stripe at the step being restored.
// readShard fills dst with bytes [off, off+len(dst)) of the shard (a data
// member's source gives zeros past the member's own length; a parity
// source gives the row) or returns an error; it must return soon after
// ctx is done. A decode calls readShard of different sources
// concurrently, and of one source one call at a time.
type shardSource interface {
	readShard(ctx context.Context, off int64, dst []byte) error
}

// shardSourceFunc adapts a function to a shardSource.
type shardSourceFunc func(ctx context.Context, off int64, dst []byte) error

func (f shardSourceFunc) readShard(ctx context.Context, off int64, dst []byte) error {
	return f(ctx, off, dst)
}

// ecDecode is one decode: which member of which stripe, from where, into
// what.
type ecDecode struct {
	codec *ckpt.Codec
	lost  int   // x, the lost data member (< K)
	shard int64 // L, the stripe's shard length
	// sources has K+M entries: data member i < K, then parity row j at
	// K+j. nil: unavailable. sources[lost] is never read.
	sources []shardSource
	// table is the lost member's committed table: its replicated regions
	// in shard order, with their sizes and CRC32Cs.
	table []tableEntry
	// views are where the regions are rebuilt, by name (stageForRestore's
	// staged views): one for each table entry, of its size.
	views map[string][]byte
	// chunk is how many bytes are read and rebuilt at a time (0:
	// ecDecodeChunk; never more than the longest region). A decode holds
	// 2 × K buffers of that size (2 more for each source that replaces a
	// dropped one).
	chunk int
}

// decodeMember rebuilds d.lost's regions into d.views and checks each
// against its committed CRC32C. It returns nil only when every view holds
// exactly the bytes the lost rank committed. On error the views hold
// unspecified bytes (a region may be half rebuilt, or rebuilt wrong and
// not yet rebuilt again) and must not be committed. The error wraps
// ErrUnrecoverable when the stripe cannot give the state (with why each
// source was dropped), errNoRoom instead when the sources dropped for
// want of room would let it (see the order above), context.Cause(ctx)
// when ctx ended first. Every
// read it started has returned by the time it returns.
//
// Decodes of several lost members of one stripe are independent, and may
// run concurrently with one codec (ckpt.Codec is safe for concurrent
// use) if their sources are too.
func decodeMember(ctx context.Context, d ecDecode) error {
	dec, err := newDecoder(d)
	if err != nil {
		return err
	}
	return dec.run(ctx)
}

// ecRegion is one region of the lost member's shard.
type ecRegion struct {
	tableEntry
	off  int64  // in the shard
	view []byte // where it is rebuilt
}

// decoder is the state of one decode; run alone owns it (the reads
// started write only their buffer and their slot of a fetch's errs).
type decoder struct {
	ecDecode
	k, n    int
	regions []ecRegion
	alive   []bool  // by source index: still usable
	dropped []error // by source index: why it was dropped
	subset  []int   // the K source indices in use, ascending
	good    []int   // the subset that rebuilt the last verified region
	bufs    [2][][]byte
	shards  [][]byte // Reconstruct's argument, reused
	want    []bool
}

func newDecoder(d ecDecode) (*decoder, error) {
	if d.codec == nil {
		return nil, errors.New("ec decode: no codec")
	}
	k, n := d.codec.K(), d.codec.K()+d.codec.M()
	if len(d.sources) != n {
		return nil, fmt.Errorf("ec decode: %d sources for a %d+%d stripe", len(d.sources), k, n-k)
	}
	if d.lost < 0 || d.lost >= k {
		return nil, fmt.Errorf("ec decode: lost member %d of %d", d.lost, k)
	}
	if d.chunk <= 0 {
		d.chunk = ecDecodeChunk
	}
	dec := &decoder{ecDecode: d, k: k, n: n, alive: make([]bool, n), dropped: make([]error, n),
		shards: make([][]byte, n), want: make([]bool, k)}
	dec.want[d.lost] = true
	var off int64
	seen := map[string]bool{}
	for _, e := range d.table {
		if seen[e.name] {
			return nil, fmt.Errorf("ec decode: region %q twice in the table", e.name)
		}
		seen[e.name] = true
		v, ok := d.views[e.name]
		if !ok || e.size < 0 || int64(len(v)) != e.size {
			return nil, fmt.Errorf("ec decode: region %q of %d bytes has no view of its size here (%d)", e.name, e.size, len(v))
		}
		if e.size > d.shard-off {
			return nil, fmt.Errorf("ec decode: regions of more than the stripe's %d bytes (region %q at %d, %d bytes)", d.shard, e.name, off, e.size)
		}
		dec.regions = append(dec.regions, ecRegion{tableEntry: e, off: off, view: v})
		off += e.size
	}
	for name := range d.views {
		if !seen[name] {
			return nil, fmt.Errorf("ec decode: view %q is not in the lost rank's table", name)
		}
	}
	dec.chunk = decodeBufLen(dec.chunk, d.table)
	for i, s := range d.sources {
		dec.alive[i] = s != nil && i != d.lost
	}
	return dec, nil
}

// decodeBufLen is the length of each of a decode's buffers for a member
// with table t: chunk, never more than the longest region (a chunk never
// spans regions).
func decodeBufLen(chunk int, t []tableEntry) int {
	var longest int64
	for _, e := range t {
		longest = max(longest, e.size)
	}
	return int(min(int64(chunk), longest))
}

// decodeBufBytes is the most a decode of a member with table t in a k+m
// stripe holds in buffers, which a restore reserves before it decodes
// (ecrestore_mem.go): two buffer sets, each with one buffer per source it
// read, at most every source but the lost member's (replacements of
// dropped sources included), each decodeBufLen long (chunk 0:
// ecDecodeChunk).
func decodeBufBytes(k, m int, t []tableEntry, chunk int) uint64 {
	if chunk <= 0 {
		chunk = ecDecodeChunk
	}
	return 2 * uint64(k+m-1) * uint64(decodeBufLen(chunk, t))
}

// fetch is the reads of one chunk, [off, off+n) of the shards, into one
// buffer set.
type fetch struct {
	set    int
	region int   // index in decoder.regions
	at     int64 // offset in the region
	n      int
	errs   []error // by source index; written by the reads, read after wg.Wait
	wg     sync.WaitGroup
	ctx    context.Context // the reads'; cancel ends them
	cancel context.CancelFunc
}

// start begins the reads of chunk (region r, at) from the sources srcs
// into buffer set f.set; each runs in its own goroutine, which wait owns.
func (d *decoder) start(ctx context.Context, set, r int, at int64) *fetch {
	reg := d.regions[r]
	f := &fetch{set: set, region: r, at: at, n: int(min(int64(d.chunk), reg.size-at)), errs: make([]error, d.n)}
	f.ctx, f.cancel = context.WithCancel(ctx)
	d.read(f, d.subset)
	return f
}

// read starts the reads of f's chunk from srcs.
func (d *decoder) read(f *fetch, srcs []int) {
	off := d.regions[f.region].off + f.at
	for _, i := range srcs {
		buf := d.buf(f.set, i)[:f.n]
		src := d.sources[i]
		f.errs[i] = nil
		f.wg.Go(func() { f.errs[i] = src.readShard(f.ctx, off, buf) })
	}
}

// abandon stops f's reads and waits for them.
func (f *fetch) abandon() {
	f.cancel()
	f.wg.Wait()
}

// buf returns buffer set set's buffer for source i, allocated on first use.
func (d *decoder) buf(set, i int) []byte {
	if d.bufs[set] == nil {
		d.bufs[set] = make([][]byte, d.n)
	}
	if d.bufs[set][i] == nil {
		d.bufs[set][i] = make([]byte, d.chunk)
	}
	return d.bufs[set][i]
}

// complete waits for f's reads. A source that failed is dropped, and
// replaced in the subset by the first usable source not in it, which is
// read for the same chunk, until the chunk is in from K sources.
func (d *decoder) complete(ctx context.Context, f *fetch) error {
	for {
		f.wg.Wait()
		if ctx.Err() != nil {
			f.cancel()
			return context.Cause(ctx)
		}
		failed := false
		for _, i := range d.subset {
			if err := f.errs[i]; err != nil {
				d.drop(i, fmt.Errorf("at byte %d: %w", d.regions[f.region].off+f.at, err))
				failed = true
			}
		}
		if !failed {
			f.cancel()
			return nil
		}
		var kept, added []int
		for _, i := range d.subset {
			if d.alive[i] {
				kept = append(kept, i)
			}
		}
		for i := 0; i < d.n && len(kept)+len(added) < d.k; i++ {
			if d.alive[i] && !slices.Contains(kept, i) {
				added = append(added, i)
			}
		}
		if len(kept)+len(added) < d.k {
			f.cancel()
			return d.tooFew()
		}
		d.subset = append(kept, added...)
		slices.Sort(d.subset)
		d.read(f, added)
	}
}

func (d *decoder) drop(i int, err error) {
	d.alive[i] = false
	d.dropped[i] = fmt.Errorf("%s: %w", d.sourceName(i), err)
}

func (d *decoder) sourceName(i int) string {
	if i < d.k {
		return fmt.Sprintf("data member %d", i)
	}
	return fmt.Sprintf("parity row %d", i-d.k)
}

func (d *decoder) usable() int {
	u := 0
	for _, a := range d.alive {
		if a {
			u++
		}
	}
	return u
}

// tooFew is the error of a decode left with fewer than K sources: one
// wrapping errNoRoom (not ErrUnrecoverable) when the sources dropped for
// want of room would make K again with the usable ones, since a retry
// once the hosts' reserves have room may decode (retryNoRoom), as for a
// log refused so (decodeReplay); else ErrUnrecoverable.
func (d *decoder) tooFew() error {
	return d.fail(d.usable()+d.droppedForRoom() >= d.k, fmt.Sprintf("%d of the %d other shards usable, %d needed", d.usable(), d.n-1, d.k))
}

// unrecoverable returns an error wrapping ErrUnrecoverable and why each
// dropped source was dropped, which does not match errNoRoom: room would
// not mend it.
func (d *decoder) unrecoverable(format string, args ...any) error {
	return d.fail(false, fmt.Sprintf(format, args...))
}

// fail returns the decode's error of what, with why each dropped source
// was dropped: wrapping errNoRoom and not ErrUnrecoverable when
// roomMayMend and a source was dropped for want of room; else wrapping
// ErrUnrecoverable and never matching errNoRoom.
func (d *decoder) fail(roomMayMend bool, what string) error {
	msg := fmt.Sprintf("member %d: %s", d.lost, what)
	why := errors.Join(d.dropped...)
	switch {
	case why == nil:
		return fmt.Errorf("%w: %s", ErrUnrecoverable, msg)
	case roomMayMend && errors.Is(why, errNoRoom):
		return fmt.Errorf("%s: %w", msg, why)
	default:
		return fmt.Errorf("%w: %s: %w", ErrUnrecoverable, msg, roomHidden{why})
	}
}

// droppedForRoom is how many sources were dropped for want of room (a
// host's reserve refused its answer: errNoRoom).
func (d *decoder) droppedForRoom() int {
	n := 0
	for _, err := range d.dropped {
		if err != nil && errors.Is(err, errNoRoom) {
			n++
		}
	}
	return n
}

// roomHidden is err as errors.Is and errors.As see it, except that it
// does not match errNoRoom: the reasons of a failure that a retry once
// there is room would not mend (retryNoRoom retries what matches
// errNoRoom).
type roomHidden struct{ err error }

func (e roomHidden) Error() string { return e.err.Error() }

func (e roomHidden) Is(target error) bool { return target != errNoRoom && errors.Is(e.err, target) }

func (e roomHidden) As(target any) bool { return errors.As(e.err, target) }

// choose sets d.subset to the next K-subset to rebuild a region from:
// the one that rebuilt the last verified region if it is usable and not
// in tried, else the lexicographically first usable one not in tried.
// It returns false when there is none.
func (d *decoder) choose(tried map[string]bool) bool {
	usable := func(s []int) bool {
		for _, i := range s {
			if !d.alive[i] {
				return false
			}
		}
		return !tried[subsetKey(s)]
	}
	if d.good != nil && usable(d.good) {
		d.subset = slices.Clone(d.good)
		return true
	}
	var cands []int
	for i, a := range d.alive {
		if a {
			cands = append(cands, i)
		}
	}
	if len(cands) < d.k {
		return false
	}
	// pos walks the K-subsets of cands in lexicographic order.
	pos := make([]int, d.k)
	for i := range pos {
		pos[i] = i
	}
	s := make([]int, d.k)
	for {
		for i, p := range pos {
			s[i] = cands[p]
		}
		if !tried[subsetKey(s)] {
			d.subset = s
			return true
		}
		i := d.k - 1
		for i >= 0 && pos[i] == len(cands)-d.k+i {
			i--
		}
		if i < 0 {
			return false
		}
		pos[i]++
		for j := i + 1; j < d.k; j++ {
			pos[j] = pos[j-1] + 1
		}
	}
}

// subsetKey names a subset of source indices (each < ckpt.MaxShards).
func subsetKey(s []int) string {
	b := make([]byte, len(s))
	for i, v := range s {
		b[i] = byte(v)
	}
	return string(b)
}

// rebuild reconstructs f's chunk of the lost member from its buffers
// into the region's view and returns the view's rebuilt bytes.
func (d *decoder) rebuild(f *fetch) ([]byte, error) {
	clear(d.shards)
	for _, i := range d.subset {
		d.shards[i] = d.bufs[f.set][i][:f.n]
	}
	reg := d.regions[f.region]
	out := reg.view[f.at : f.at+int64(f.n) : f.at+int64(f.n)]
	d.shards[d.lost] = out[:0]
	if err := d.codec.Reconstruct(d.shards, d.want); err != nil {
		return nil, fmt.Errorf("ec decode: member %d, region %q at %d: %w", d.lost, reg.name, f.at, err)
	}
	if got := d.shards[d.lost]; len(got) != f.n || &got[0] != &out[0] {
		// The codec filled a buffer of its own: the view has not got it.
		return nil, fmt.Errorf("ec decode: member %d, region %q at %d: rebuilt outside the view", d.lost, reg.name, f.at)
	}
	return out, nil
}

// run rebuilds every region in shard order. The reads of chunk c+1 are
// under way while chunk c is rebuilt; a region's CRC32C is taken over its
// rebuilt bytes chunk by chunk, right after each chunk is written.
func (d *decoder) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Empty regions need no read: their CRC32C is that of nothing.
	first := -1
	for r, reg := range d.regions {
		if reg.size == 0 {
			if reg.sum != 0 {
				return d.unrecoverable("region %q is empty but its committed CRC32C is %08x", reg.name, reg.sum)
			}
		} else if first < 0 {
			first = r
		}
	}
	if first < 0 {
		return nil
	}
	tried := map[string]bool{}
	if !d.choose(tried) {
		return d.tooFew()
	}
	// next returns the chunk after (r, at) of a region with bytes, or
	// r = -1 after the last.
	next := func(r int, at int64, n int) (int, int64) {
		if at += int64(n); at < d.regions[r].size {
			return r, at
		}
		for r++; r < len(d.regions); r++ {
			if d.regions[r].size > 0 {
				return r, 0
			}
		}
		return -1, 0
	}
	pending := d.start(ctx, 0, first, 0)
	defer func() {
		if pending != nil {
			pending.abandon()
		}
	}()
	var crc uint32
	for pending != nil {
		f := pending
		pending = nil
		if err := d.complete(ctx, f); err != nil {
			return err
		}
		if r, at := next(f.region, f.at, f.n); r >= 0 {
			pending = d.start(ctx, 1-f.set, r, at)
		}
		out, err := d.rebuild(f)
		if err != nil {
			return err
		}
		crc = crc32c.Update(crc, out)
		reg := d.regions[f.region]
		if f.at+int64(f.n) < reg.size {
			continue
		}
		if crc == reg.sum {
			d.good, tried, crc = slices.Clone(d.subset), map[string]bool{}, 0
			continue
		}
		// Wrong bytes from this subset: rebuild the region from the
		// next one. What was read ahead came from the same subset.
		tried[subsetKey(d.subset)] = true
		if pending != nil {
			pending.abandon()
			pending = nil
		}
		if !d.choose(tried) {
			if d.usable() < d.k {
				return d.tooFew()
			}
			// A source dropped for want of room would give subsets not
			// tried yet: a retry once there is room may decode.
			return d.fail(d.droppedForRoom() > 0, fmt.Sprintf("region %q (%d bytes): no %d of the %d usable shards rebuild its committed CRC32C %08x (%d subsets tried)",
				reg.name, reg.size, d.k, d.usable(), reg.sum, len(tried)))
		}
		crc = 0
		pending = d.start(ctx, f.set, f.region, 0)
	}
	return nil
}
