package keeper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
)

// refuseEC drains a request's data, then refuses it.
func refuseEC(c io.ReadWriter, h linkHdr, why uint32, msg string) error {
	return refusePut(c, h, why, msg)
}

// chunk receives an ecChunk (its ecHdr read) into buf, the link's
// buffer. The bytes are read and checked against their CRC32C before the
// row is locked: the K members of a stripe send to one row at once, and
// each link receives while another's chunk is XORed in.
func (ps *parityStore) chunk(c net.Conn, h linkHdr, e ecHdr, buf *[]byte) error {
	n := int64(h.length)
	if h.count != 0 || h.step < 0 || n < 1 || n > maxECRange || e.off > e.n || n > e.n-e.off {
		return fmt.Errorf("ecChunk of %d bytes at %d of a share of %d, %d regions, step %d", n, e.off, e.n, h.count, h.step)
	}
	k, why := ps.check(h, e)
	if why != "" {
		return refuseEC(c, h, failOther, why)
	}
	if int64(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	d := (*buf)[:n]
	sum, err := readSum(c, d)
	if err != nil {
		return err
	}
	if sum != e.crc {
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d step %d share of row %d at %d: CRC32C %08x, sent %08x", h.owner, h.step, e.row, e.off, sum, e.crc))
	}
	r := ps.row(ecRowKey{e.group, e.stripe, e.row}, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped {
		return writeFail(c, h, failOther, "the row is no longer kept here")
	}
	b, fwhy, msg := ps.bufFor(r, h.step, h.gen, e.epoch, k, true, e.hb)
	if b == nil {
		return writeFail(c, h, fwhy, fmt.Sprintf("rank %d: %s", h.owner, msg))
	}
	m := &b.mem[e.member]
	switch {
	case m.rank < 0:
		*m = memberShare{rank: h.owner, length: e.n, cov: cover{size: e.n}}
	case m.rank != h.owner || m.length != e.n:
		return writeFail(c, h, failOther, fmt.Sprintf("member %d of step %d is rank %d with a shard of %d bytes, not rank %d with %d", e.member, h.step, m.rank, m.length, h.owner, e.n))
	case m.bad != "":
		return writeFail(c, h, failShare, m.bad)
	}
	if m.cov.fits(e.off, n) != nil {
		if !covered(&m.cov, e.off, n) {
			return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: a share chunk of %d bytes at %d overlaps others", h.owner, h.step, n, e.off))
		}
		// A resend: in already, if these are the bytes that came.
		switch sum, ok := m.chunkSum(e.off, n); {
		case !ok:
			return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: a share chunk of %d bytes at %d is not cut as the chunks that came", h.owner, h.step, n, e.off))
		case sum != e.crc:
			msg := fmt.Sprintf("rank %d step %d: parity row %d of stripe %d of group %d on host %d holds other bytes of the share at %d (CRC32C %08x) than the ones sent again (%08x), and cannot take them out",
				h.owner, h.step, e.row, e.stripe, e.group, ps.h.cfg.Host, e.off, sum, e.crc)
			if !m.in {
				// Not committed: no commit vouches for the bytes in.
				// (A committed share stays: its commit vouched for them.)
				m.bad = msg
				ps.h.log.Warn("a member's share of a parity row is refused for the step", "err", msg)
			}
			return writeFail(c, h, failShare, msg)
		}
		return writeAck(c, h)
	}
	if len(m.chunks) >= maxShareChunks {
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: more than %d chunks of one share", h.owner, h.step, maxShareChunks))
	}
	if b.pin != nil {
		// ecGet answers are being written from b's array: mix must not
		// write into it.
		if err := ps.detach(b, e.n); err != nil {
			return writeFail(c, h, failNoRoom, err.Error())
		}
	}
	if int64(len(b.data)) < e.n {
		if err := ps.grow(r, b, e.n); err != nil {
			if time.Since(r.noRoom) > noRoomLog {
				r.noRoom = time.Now()
				ps.h.log.Error("a parity row does not fit in the memory replicas may take on this host: its stripe's steps are not replicated until there is room",
					"group", e.group, "stripe", e.stripe, "row", e.row, "step", h.step, "from rank", h.owner, "err", err)
			}
			return writeFail(c, h, failNoRoom, err.Error())
		}
	}
	b.n = max(b.n, e.n)
	if err := m.cov.add(e.off, n, e.crc); err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	m.addChunk(e.off, n, e.crc)
	b.mix(e.member, e.off, d)
	return writeAck(c, h)
}

// readPiece bounds one read of readSum: the bytes a read returns are
// checksummed while they are still in the core's cache.
const readPiece = 256 << 10

// readSum fills d from r and returns the CRC32C of its bytes, computed
// read by read: each read's bytes right after the kernel copied them in.
func readSum(r io.Reader, d []byte) (uint32, error) {
	var sum uint32
	for got := 0; got < len(d); {
		n, err := r.Read(d[got:min(got+readPiece, len(d))])
		sum = crc32c.Update(sum, d[got:got+n])
		got += n
		if err != nil && got < len(d) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	return sum, nil
}

// covered says whether every byte of [off, off+n) passed cov.
func covered(cov *cover, off, n int64) bool {
	i := cov.search(off + 1)
	return i > 0 && cov.spans[i-1].lo <= off && cov.spans[i-1].hi >= off+n
}

// grow makes b's data n bytes long, accounting for them.
func (ps *parityStore) grow(r *parityRow, b *parityBuf, n int64) error {
	old := uint64(len(b.data))
	if err := ps.h.store.reserve(uint64(n), old); err != nil {
		return fmt.Errorf("a parity row of %d bytes: %w", n, err)
	}
	d := make([]byte, n)
	copy(d, b.data[:b.n])
	b.data = d
	return nil
}

// commit receives an ecCommit: member e.member's share of step is in.
func (ps *parityStore) commit(c net.Conn, h linkHdr, t []tableEntry, e ecHdr) error {
	if h.length != 0 || h.step < 0 || int64(tableBytes(t)) != e.n {
		return fmt.Errorf("ecCommit of regions of %d bytes for a shard of %d, step %d", tableBytes(t), e.n, h.step)
	}
	k, why := ps.check(h, e)
	if why != "" {
		return writeFail(c, h, failOther, why)
	}
	if hook := testHookECCommit.Load(); hook != nil {
		(*hook)(h, e)
	}
	r := ps.row(ecRowKey{e.group, e.stripe, e.row}, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	// A share of no bytes (an empty shard) has no chunks: it begins here.
	b, fwhy, msg := ps.bufFor(r, h.step, h.gen, e.epoch, k, e.n == 0, e.hb)
	if b == nil {
		return writeFail(c, h, fwhy, fmt.Sprintf("rank %d: %s", h.owner, msg))
	}
	m := &b.mem[e.member]
	if m.rank < 0 && e.n == 0 {
		*m = memberShare{rank: h.owner}
	}
	switch {
	case m.rank != h.owner || m.length != e.n:
		return writeFail(c, h, failOther, fmt.Sprintf("no share of %d bytes of rank %d step %d here", e.n, h.owner, h.step))
	case m.bad != "":
		return writeFail(c, h, failShare, m.bad)
	case m.in && !slices.Equal(m.table, t):
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d is in with other CRC32Cs (a second commit of the step under one placement)", h.owner, h.step))
	case !m.cov.whole():
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: %d of the share's %d bytes came", h.owner, h.step, m.cov.n, m.length))
	case m.cov.sum() != e.crc:
		// Chunks that each matched their CRC32C, but not the share's:
		// the commit is wrong, not the bytes (a resend is compared with
		// them). Refused; the other members' shares stay in.
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d step %d: the share's CRC32C is %08x, the owner's %08x", h.owner, h.step, m.cov.sum(), e.crc))
	}
	m.table, m.in = t, true
	r.gen = max(r.gen, h.gen)
	return writeAck(c, h)
}

// testHookECCommit, if set (by tests, setECCommitHook), is called by a
// parity host when an ecCommit arrives, before it looks at the row. It
// is atomic: a test may set it while a job's links serve.
var testHookECCommit atomic.Pointer[func(h linkHdr, e ecHdr)]

// has answers an ecHas: ack if member e.member's share of step with
// exactly table t is in, of the request's label (or the step is final).
func (ps *parityStore) has(c net.Conn, h linkHdr, t []tableEntry, e ecHdr) error {
	if h.length != 0 {
		return fmt.Errorf("ecHas with %d bytes of data", h.length)
	}
	if _, why := ps.check(h, e); why != "" {
		return writeFail(c, h, failOther, why)
	}
	r := ps.row(ecRowKey{e.group, e.stripe, e.row}, false)
	if r == nil {
		return writeFail(c, h, failOther, "no share of the row here")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped {
		return writeFail(c, h, failOther, "the row is no longer kept here")
	}
	b, fwhy, msg := ps.bufFor(r, h.step, h.gen, e.epoch, 0, false, noStep)
	if b == nil {
		return writeFail(c, h, fwhy, msg)
	}
	if m := b.mem[e.member]; m.in && m.rank == h.owner && slices.Equal(m.table, t) {
		r.gen = max(r.gen, h.gen)
		b.gen = max(b.gen, h.gen)
		return writeAck(c, h)
	}
	return writeFail(c, h, failOther, fmt.Sprintf("rank %d's share of step %d with these regions is not in", h.owner, h.step))
}

// read copies bytes [off, off+len(dst)) of the complete row of stripe of
// group at step into dst (zeros past the row's end) and returns its
// members: an error if no complete row of that step is here.
func (ps *parityStore) read(group, stripe, row int, step, off int64, dst []byte) ([]ecMember, error) {
	a, err := ps.pinRange(group, stripe, row, step, off, int64(len(dst)))
	if err != nil {
		return nil, err
	}
	defer ps.unpin(a)
	n := 0
	for _, d := range a.data {
		n += copy(dst[n:], d)
	}
	return a.members, nil
}

// rowAnswer is a range of a complete parity row as ecGet sends it: the
// row's members, and the range's bytes as slices of the buffer's own
// array (then zeroPad for the bytes past the row's end), which the pin
// keeps unwritten until unpin.
type rowAnswer struct {
	r       *parityRow
	b       *parityBuf
	pin     *rowPin
	members []ecMember
	data    net.Buffers
}

// zeroPad is the bytes sent for a range past a row's end; never written.
var zeroPad [1 << 20]byte

// pinRange returns bytes [off, off+n) of the complete row of stripe of
// group at step (zeros past the row's end), pinned: the caller must
// unpin the answer once it no longer reads its bytes. An error if no
// complete row of that step is here.
//
// What keeps the bytes from being overwritten while they are read
// outside the row's lock: a row buffer's array is written only by mix
// (parityStore.chunk), under the row's lock, and chunk gives a pinned
// buffer a new array first (detach); grow writes only a new array; sweep
// and restart do not write the array. The pinned array is thus never
// written again, whatever steps come meanwhile: the answer is the row of
// step as it was complete, never torn by a newer step's shares.
func (ps *parityStore) pinRange(group, stripe, row int, step, off, n int64) (*rowAnswer, error) {
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("a range of %d bytes at %d of a parity row", n, off)
	}
	r := ps.row(ecRowKey{group, stripe, row}, false)
	if r == nil {
		return nil, fmt.Errorf("no parity row %d of stripe %d of group %d here", row, stripe, group)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.bufs {
		b := &r.bufs[i]
		if b.step != step || !b.complete() {
			continue
		}
		if b.pin == nil {
			b.pin = &rowPin{}
		}
		b.pin.answers++
		return &rowAnswer{r: r, b: b, pin: b.pin, members: b.members(), data: rangeBufs(b.data[:b.n], off, n)}, nil
	}
	return nil, fmt.Errorf("no complete parity row %d of stripe %d of group %d at step %d here", row, stripe, group, step)
}

// rangeBufs returns bytes [off, off+n) of src as slices of it, then of
// zeroPad for the bytes past its end.
func rangeBufs(src []byte, off, n int64) net.Buffers {
	var out net.Buffers
	if off < int64(len(src)) {
		d := src[off:min(off+n, int64(len(src)))]
		out = append(out, d)
		n -= int64(len(d))
	}
	for n > 0 {
		z := zeroPad[:min(n, int64(len(zeroPad)))]
		out = append(out, z)
		n -= int64(len(z))
	}
	return out
}

// unpin ends a's hold of its buffer's array: the last answer of an array
// detached from its buffer gives the bytes reserved for it back.
func (ps *parityStore) unpin(a *rowAnswer) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	p := a.pin
	if p.answers--; p.answers > 0 {
		return
	}
	if a.b.pin == p {
		a.b.pin = nil
	}
	if p.held > 0 {
		ps.h.store.reserve(0, p.held)
		p.held = 0
	}
}

// detach gives b, whose array answers are being written from (b.pin), an
// array of its own of at least n bytes, with its row so far (b.data[:b.n])
// copied in. The pinned array stays as it is for the answers, its bytes
// reserved until the last one ends (unpin); the new array is reserved
// too, or detach fails with the reserve's error and changes nothing.
// r.mu is held.
func (ps *parityStore) detach(b *parityBuf, n int64) error {
	old := uint64(len(b.data))
	size := max(int64(old), n)
	if err := ps.h.store.reserve(uint64(size), 0); err != nil {
		return fmt.Errorf("a parity row of %d bytes beside the %d answers being sent from its buffer: %w", size, b.pin.answers, err)
	}
	d := make([]byte, size)
	copy(d, b.data[:b.n])
	b.pin.held, b.pin = old, nil
	b.data = d
	return nil
}

// testHookECGetPinned, if set (by tests), is called by an ecGet answer
// once its bytes are pinned (pinRange), before they are written.
var testHookECGetPinned atomic.Pointer[func(h linkHdr, e ecHdr)]

// ecGet answers an ecGet: the bytes are written from the row's buffer
// itself (pinRange), not copied.
func (ps *parityStore) ecGet(c net.Conn, h linkHdr, e ecHdr) error {
	if h.length != 0 || h.count != 0 || e.n > maxECRange || e.n < 0 || e.off < 0 {
		return fmt.Errorf("ecGet of %d bytes at %d", e.n, e.off)
	}
	p := ps.h.place()
	if _, why := p.parityHeld(ps.h.cfg.Host, h.holder, e.group, e.stripe, e.row); why != "" {
		// A row kept as spare still serves.
		if r := ps.row(ecRowKey{e.group, e.stripe, e.row}, false); r == nil {
			return writeFail(c, h, failOther, why)
		}
	}
	ans, err := ps.pinRange(e.group, e.stripe, e.row, h.step, e.off, e.n)
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	defer ps.unpin(ans)
	if hook := testHookECGetPinned.Load(); hook != nil {
		(*hook)(h, e)
	}
	a := linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen, length: uint64(e.n)}
	b := make([]byte, linkHdrSize)
	a.put(b)
	b = appendMembers(b, ans.members)
	bufs := append(net.Buffers{b}, ans.data...)
	// The pinned array (reserved once detached) is let go when the reader
	// has not taken the answer within ecAnswerWait: a reader on a host
	// that died would hold it until TCP gives up (minutes).
	if err := writeAnswerBuffers(c, nil, bufs); err != nil {
		return fmt.Errorf("an ecGet answer of %d bytes: %w", e.n, err)
	}
	return nil
}

// ecAnswerWait bounds the writing of each maxECRange bytes of an answer
// (writeAnswer: 2 MiB/s at least); a variable for tests.
var ecAnswerWait = slowWait

// writeAnswer has write write an answer to a request to the link c
// through a writer whose every maxECRange bytes its reader must take
// within ecAnswerWait, else the write fails (os.ErrDeadlineExceeded)
// and the link is to be closed: a reader on a host that died would
// otherwise hold what the answer pins or reserves (a row's array, an
// answer's buffer, a slot's mapping) until TCP gives up (minutes). When
// life (nil: none) ends, the write fails at its next maxECRange bytes
// (whoever ends it also sets c's write deadline to the past, to end the
// one being written). The deadline is cleared once the answer is
// written.
func writeAnswer(c net.Conn, life context.Context, write func(w io.Writer) error) error {
	if life == nil {
		life = context.Background()
	}
	if err := write(answerConn{c: c, life: life}); err != nil {
		return err
	}
	return c.SetWriteDeadline(time.Time{})
}

// writeAnswerBuffers is writeAnswer of bufs (a writev per run: writeBufs).
func writeAnswerBuffers(c net.Conn, life context.Context, bufs net.Buffers) error {
	return writeAnswer(c, life, func(w io.Writer) error { return writeBufs(w, bufs) })
}

// answerConn is the writer of writeAnswer.
type answerConn struct {
	c    net.Conn
	life context.Context
}

// maxAnswerRun is the most bytes writeBuffers writes under one deadline:
// a range of maxECRange bytes with its header and table, in one call.
const maxAnswerRun = maxECRange + 64<<10

// writeBuffers writes bufs to the link in runs of at most maxAnswerRun
// bytes, each in one writev with a write deadline ecAnswerWait away (a
// buffer longer than that alone, through Write): the header and the data
// of an answer go out in one call, as net.Buffers writes to a net.Conn.
// writeBufs uses it for an answerConn (writeFrame, pieces, log frames).
func (a answerConn) writeBuffers(bufs net.Buffers) error {
	for len(bufs) > 0 {
		i, n := 0, 0
		for i < len(bufs) && (i == 0 || n+len(bufs[i]) <= maxAnswerRun) {
			n += len(bufs[i])
			i++
		}
		if n > maxAnswerRun {
			if _, err := a.Write(bufs[0]); err != nil {
				return err
			}
			bufs = bufs[1:]
			continue
		}
		if err := a.c.SetWriteDeadline(time.Now().Add(ecAnswerWait)); err != nil {
			return err
		}
		if err := a.life.Err(); err != nil {
			return fmt.Errorf("an answer's write: %w", err)
		}
		run := slices.Clone(bufs[:i]) // WriteTo consumes what it writes
		if _, err := run.WriteTo(a.c); err != nil {
			return err
		}
		bufs = bufs[i:]
	}
	return nil
}

// Write writes p to the link in pieces of at most maxECRange bytes, each
// with a write deadline ecAnswerWait away.
func (a answerConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if err := a.c.SetWriteDeadline(time.Now().Add(ecAnswerWait)); err != nil {
			return n, err
		}
		// Checked after the deadline is set: a life ended meanwhile set
		// its own (past) deadline before, or is seen here.
		if err := a.life.Err(); err != nil {
			return n, fmt.Errorf("an answer's write: %w", err)
		}
		k, err := a.c.Write(p[:min(len(p), maxECRange)])
		n += k
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// shardRange copies bytes [off, off+len(dst)) of owner's shard at step
// (its replicated regions concatenated, zeros past its end) into dst,
// and returns its table. When holder is owner and runs here, the shard
// comes from owner's retained snapshot of base step step (diff mode under
// EC: a rank on its own data host keeps it, service.retainedBase), else
// from its slot; otherwise from the clear copy this host keeps of owner:
// a full-mode replica's buffer of step, or, in diff mode, the base at
// exactly step of one of its stores (diffstore.Store.ReadBase: the base,
// pinned at H under EC, or a verified refresh waiting for G), with the
// CRC32Cs the owner committed at step. The bytes are the source's as
// they are: the caller checks them against the table.
func (h *Keeper) shardRange(owner, holder int, step, off int64, dst []byte) ([]tableEntry, error) {
	if s := h.svc(owner); s != nil && holder == owner {
		var t []tableEntry
		read := func(tab []tableEntry, data [][]byte) error {
			t = slices.Clone(tab)
			copyShard(dst, data, off)
			return nil
		}
		if ok, err := s.retainedBase(step, read); ok || err != nil {
			return t, err
		}
		s.mu.Lock()
		var names []string
		for _, i := range s.repl {
			names = append(names, s.regions[i].Name)
		}
		s.mu.Unlock()
		err := s.readSlot(step, names, read)
		return t, err
	}
	st := h.store
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil, fmt.Errorf("no copy of rank %d here", owner)
	}
	o.mu.Lock()
	for _, b := range o.bufs {
		if b.step >= 0 && b.step == step && len(b.data) == len(b.table) {
			copyShard(dst, b.data, off)
			t := slices.Clone(b.table)
			o.mu.Unlock()
			return t, nil
		}
	}
	// Diff mode: ReadBase needs no lock of o (a store serves its base
	// safely while it folds, installs or truncates), and the copy is not
	// made under o.mu, which the owner's differentials wait for.
	stores := []*diffstore.Store{o.cur, o.prev}
	t := slices.Clone(o.sums[step])
	o.mu.Unlock()
	var errs []error
	for _, ds := range stores {
		if ds == nil || t == nil {
			continue
		}
		if !sameShape(t, regionTable(ds.Regions())) {
			errs = append(errs, fmt.Errorf("a store of rank %d whose regions are not those of its step %d", owner, step))
			continue
		}
		err := ds.ReadBase(step, off, dst)
		if err == nil {
			return t, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no copy of rank %d at step %d here", owner, step)
	}
	return nil, fmt.Errorf("no copy of rank %d at step %d here: %w", owner, step, errors.Join(errs...))
}

// copyShard copies bytes [off, off+len(dst)) of the concatenation of
// data into dst, zeros past its end.
func copyShard(dst []byte, data [][]byte, off int64) {
	n := 0
	for _, d := range data {
		if n == len(dst) {
			break
		}
		if off >= int64(len(d)) {
			off -= int64(len(d))
			continue
		}
		n += copy(dst[n:], d[off:])
		off = 0
	}
	clear(dst[n:])
}

// answerBufs are the buffers getRange answers are copied into (each ≤
// maxECRange bytes; an ecGet answer is sent from the row itself), kept
// for the next answers: a decode asks for hundreds of chunks of MiBs, and
// a buffer allocated for each would be faulted in afresh each time (with
// BenchmarkECRestore, the parity hosts' allocations and faults took more
// time than the copies). A buffer in use is reserved against the host's
// replica-memory reserve (getRange's hold); one kept idle in the pool is
// not (the collector may free it).
var answerBufs sync.Pool

// getAnswerBuf reserves n bytes against the host's replica-memory
// reserve and returns a buffer of n bytes from answerBufs, of unspecified
// contents (shardRange writes every byte of it), or an error wrapping
// errNoRoom and allocates nothing. putAnswerBuf gives both back.
func (st *replicaStore) getAnswerBuf(n int64) ([]byte, error) {
	if err := st.reserve(uint64(n), 0); err != nil {
		return nil, fmt.Errorf("%w: an answer's buffer (%d bytes): %w", errNoRoom, n, err)
	}
	if p, ok := answerBufs.Get().(*[]byte); ok && int64(cap(*p)) >= n {
		return (*p)[:n], nil
	}
	return make([]byte, n), nil
}

// putAnswerBuf keeps b for the next answers and gives the bytes
// getAnswerBuf reserved for it back.
func (st *replicaStore) putAnswerBuf(b []byte) {
	st.reserve(0, uint64(len(b)))
	answerBufs.Put(&b)
}

// getRange answers a getRange.
func (ps *parityStore) getRange(c net.Conn, h linkHdr, e ecHdr) error {
	if h.length != 0 || h.count != 0 || e.n > maxECRange || h.step < 0 {
		return fmt.Errorf("getRange of %d bytes", e.n)
	}
	buf, err := ps.h.store.getAnswerBuf(e.n)
	if err != nil {
		return writeFail(c, h, failNoRoom, fmt.Sprintf("rank %d step %d: %v", h.owner, h.step, err))
	}
	defer ps.h.store.putAnswerBuf(buf)
	var t []tableEntry
	var life context.Context
	if s := ps.h.svc(h.holder); s != nil && h.holder == h.owner {
		// The rank's service closing ends a write held up by the reader.
		life = s.life
		defer context.AfterFunc(s.life, func() { c.SetWriteDeadline(time.Unix(1, 0)) })()
	}
	t, err = ps.h.shardRange(h.owner, h.holder, h.step, e.off, buf)
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	a := linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	a.count, a.length = len(t), uint64(e.n)
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45)
	a.put(b)
	b = appendTable(b, t)
	// The reserved buffer is let go when the reader does not take the
	// answer (writeAnswer).
	return writeAnswerBuffers(c, life, net.Buffers{b, buf})
}

// serveEC serves one EC request (kinds 10 to 14) whose header and table
// were read: an error closes the link. buf is the link's ecChunk buffer
// (grown as needed).
func (ps *parityStore) serveEC(c net.Conn, h linkHdr, t []tableEntry, buf *[]byte) error {
	if ps.h.diffMode() && ps.h.place().ec == nil {
		return fmt.Errorf("request kind %d of erasure coding, this host runs --protect-mode diff without it", h.kind)
	}
	e, err := readECHdr(c)
	if err != nil {
		return err
	}
	switch h.kind {
	case kindECChunk:
		return ps.chunk(c, h, e, buf)
	case kindECCommit:
		return ps.commit(c, h, t, e)
	case kindECHas:
		return ps.has(c, h, t, e)
	case kindECGet:
		return ps.ecGet(c, h, e)
	default:
		return ps.getRange(c, h, e)
	}
}
