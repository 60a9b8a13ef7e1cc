package wire

import (
	"encoding/binary"
	"math"
)

// tableMagic starts every encoded epoch table; the second byte is the format version.
var tableMagic = [2]byte{'T', 5}

// Encode encodes t in the compact binary form every agent of the job
// receives (once per epoch, so at 10,000 hosts its size and decoding cost
// matter: ranks are stored as ranges and nothing is escaped):
//
//	'T' 4 uvarint(version) uvarint(epoch) uvarint(world) str(job)
//	str(masterAddr) uvarint(masterPort) uvarint(nhosts)
//	{ str(name) str(addr) uvarint(replicaPort) uvarint(flags)
//	  uvarint(nranges) { uvarint(first) uvarint(count) uvarint(stride) }* }*
//	uvarint(gen) uvarint(G+1)
//	uvarint(nholderRows) { uvarint(rank) uvarint(n) { uvarint(holder) }* }*
//	uvarint(nrestoreRows) { uvarint(rank) uvarint(opt) uvarint(params) uvarint(rflags) }*
//	uvarint(K) [ uvarint(M) uvarint(ngroups)
//	  { K+M × uvarint(host) K × uvarint(data host) M × uvarint(parity host)
//	    uvarint(L) K×L × uvarint(rank) }* ]
//	uvarint(nlogRows) { uvarint(rank) uvarint(n) { uvarint(holder) }* }*
//	uvarint(H+1)
//
// where str is uvarint(len) followed by the bytes, flags has bit 0 for
// Spare and bit 1 for Fenced, rflags bit 0 for Decode, K is 0 for a table
// without EC (and nothing follows it), and L is the length of each of a
// group's K data groups, which follow one another. The log rows
// (diff mode under erasure coding) are written as the holder rows are.
func (t *EpochTable) Encode() []byte {
	n := 32 + len(t.Job) + len(t.MasterAddr)
	for _, h := range t.Hosts {
		n += 5 + len(h.Name) + len(h.Addr) + 6*len(h.Ranks)
	}
	for _, row := range t.Holders {
		n += 4 + 3*len(row.Holders)
	}
	for _, row := range t.Logs {
		n += 4 + 3*len(row.Holders)
	}
	n += 10*len(t.Restore) + 10
	if t.EC != nil {
		n += 3 + 3*t.World
		for _, g := range t.EC.Groups {
			n += 1 + 6*len(g.Hosts)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, tableMagic[:]...)
	b = binary.AppendUvarint(b, uint64(t.Version))
	b = binary.AppendUvarint(b, t.Epoch)
	b = binary.AppendUvarint(b, uint64(t.World))
	b = appendStr(b, t.Job)
	b = appendStr(b, t.MasterAddr)
	b = binary.AppendUvarint(b, uint64(t.MasterPort))
	b = binary.AppendUvarint(b, uint64(len(t.Hosts)))
	for _, h := range t.Hosts {
		b = appendStr(b, h.Name)
		b = appendStr(b, h.Addr)
		b = binary.AppendUvarint(b, uint64(h.ReplicaPort))
		var flags uint64
		if h.Spare {
			flags |= hostSpare
		}
		if h.Fenced {
			flags |= hostFenced
		}
		b = binary.AppendUvarint(b, flags)
		b = binary.AppendUvarint(b, uint64(len(h.Ranks)))
		for _, r := range h.Ranks {
			b = binary.AppendUvarint(b, uint64(r.First))
			b = binary.AppendUvarint(b, uint64(r.Count))
			b = binary.AppendUvarint(b, uint64(r.Stride))
		}
	}
	b = binary.AppendUvarint(b, t.Gen)
	b = binary.AppendUvarint(b, uint64(t.G+1))
	b = appendHolderRows(b, t.Holders)
	b = binary.AppendUvarint(b, uint64(len(t.Restore)))
	for _, row := range t.Restore {
		b = binary.AppendUvarint(b, uint64(row.Rank))
		b = binary.AppendUvarint(b, uint64(row.Opt))
		b = binary.AppendUvarint(b, uint64(row.Params))
		var rflags uint64
		if row.Decode {
			rflags |= restoreDecode
		}
		b = binary.AppendUvarint(b, rflags)
	}
	b = t.EC.append(b)
	b = appendHolderRows(b, t.Logs)
	return binary.AppendUvarint(b, uint64(t.H+1))
}

// appendHolderRows appends rows as Encode writes them: their count, then
// each row's rank, holder count and holders.
func appendHolderRows(b []byte, rows []HolderRow) []byte {
	b = binary.AppendUvarint(b, uint64(len(rows)))
	for _, row := range rows {
		b = binary.AppendUvarint(b, uint64(row.Rank))
		b = binary.AppendUvarint(b, uint64(len(row.Holders)))
		for _, h := range row.Holders {
			b = binary.AppendUvarint(b, uint64(h))
		}
	}
	return b
}

// append appends ec as Encode writes it (K = 0 for a nil ec).
func (ec *ECTable) append(b []byte) []byte {
	if ec == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(ec.K))
	b = binary.AppendUvarint(b, uint64(ec.M))
	b = binary.AppendUvarint(b, uint64(len(ec.Groups)))
	ints := func(xs []int) {
		for _, x := range xs {
			b = binary.AppendUvarint(b, uint64(x))
		}
	}
	for _, g := range ec.Groups {
		ints(g.Hosts)
		ints(g.Data)
		ints(g.Parity)
		l := 0
		if len(g.DataGroups) > 0 {
			l = len(g.DataGroups[0])
		}
		b = binary.AppendUvarint(b, uint64(l))
		for _, dg := range g.DataGroups {
			ints(dg)
		}
	}
	return b
}

// Host flags of the binary table.
const (
	hostSpare  = 1 << 0
	hostFenced = 1 << 1
)

// Restore row flags of the binary table.
const restoreDecode = 1 << 0

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader decodes the primitives of the binary formats, remembering the
// first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint(max uint64, what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = malformed("epoch table: truncated or bad %s", what)
		return 0
	}
	if v > max {
		r.err = malformed("epoch table: %s %d out of range", what, v)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str(what string) string {
	n := r.uvarint(MaxStringLen, what+" length")
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = malformed("epoch table: truncated %s", what)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// DecodeEpochTable decodes a table encoded by Encode and checks that every
// rank of the world appears on exactly one host.
func DecodeEpochTable(b []byte) (*EpochTable, error) {
	if len(b) < 2 || b[0] != tableMagic[0] {
		return nil, malformed("epoch table: bad magic")
	}
	if b[1] != tableMagic[1] {
		return nil, malformed("epoch table: format %d, want %d", b[1], tableMagic[1])
	}
	r := &reader{b: b[2:]}
	t := &EpochTable{}
	t.Version = int(r.uvarint(1<<16, "version"))
	t.Epoch = r.uvarint(math.MaxUint64, "epoch")
	t.World = int(r.uvarint(MaxWorld, "world size"))
	t.Job = r.str("job id")
	t.MasterAddr = r.str("master address")
	t.MasterPort = int(r.uvarint(65535, "master port"))
	// Each host takes at least 4 bytes: bound the allocation by the input.
	nhosts := r.uvarint(min(MaxHosts, uint64(len(r.b))/4), "host count")
	if r.err != nil {
		return nil, r.err
	}
	t.Hosts = make([]TableHost, nhosts)
	for i := range t.Hosts {
		h := &t.Hosts[i]
		h.Name = r.str("host name")
		h.Addr = r.str("host address")
		h.ReplicaPort = int(r.uvarint(65535, "replica port"))
		flags := r.uvarint(hostSpare|hostFenced, "host flags")
		h.Spare, h.Fenced = flags&hostSpare != 0, flags&hostFenced != 0
		nr := r.uvarint(uint64(len(r.b))/3, "range count")
		if r.err != nil {
			return nil, r.err
		}
		if nr > 0 {
			h.Ranks = make(RankSet, nr)
		}
		for k := range h.Ranks {
			h.Ranks[k] = RankRange{
				First:  int(r.uvarint(MaxWorld, "rank")),
				Count:  int(r.uvarint(MaxWorld, "rank count")),
				Stride: int(r.uvarint(MaxWorld, "rank stride")),
			}
		}
		if r.err != nil {
			return nil, r.err
		}
	}
	t.Gen = r.uvarint(math.MaxInt64, "generation")
	t.G = int64(r.uvarint(MaxStep+1, "resume step")) - 1
	// A row takes at least 2 bytes (holder rows 3): bound the allocations
	// by the input.
	t.Holders = r.holderRows(t.World, "holder")
	if r.err != nil {
		return nil, r.err
	}
	nrs := r.uvarint(min(uint64(t.World), uint64(len(r.b))/3), "restore row count")
	if r.err != nil {
		return nil, r.err
	}
	if nrs > 0 {
		t.Restore = make([]RestoreRow, nrs)
	}
	for i := range t.Restore {
		t.Restore[i] = RestoreRow{
			Rank:   int(r.uvarint(MaxWorld, "restore rank")),
			Opt:    int(r.uvarint(MaxWorld, "restore optimizer source")),
			Params: int(r.uvarint(MaxWorld, "restore params source")),
			Decode: r.uvarint(restoreDecode, "restore flags") != 0,
		}
	}
	t.EC = r.ecTable(len(t.Hosts), t.World)
	t.Logs = r.holderRows(t.World, "log holder")
	t.H = int64(r.uvarint(MaxStep+1, "coded base step")) - 1
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, malformed("epoch table: %d bytes of trailing data", len(r.b))
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// holderRows decodes rows as appendHolderRows writes them, of a world of
// world ranks (nil for none); what names them in errors. A row takes at
// least 3 bytes: the allocations are bounded by the input left.
func (r *reader) holderRows(world int, what string) []HolderRow {
	n := r.uvarint(min(uint64(world), uint64(len(r.b))/3), what+" row count")
	if r.err != nil || n == 0 {
		return nil
	}
	rows := make([]HolderRow, n)
	for i := range rows {
		row := &rows[i]
		row.Rank = int(r.uvarint(MaxWorld, what+" row rank"))
		k := r.uvarint(min(MaxHolders, uint64(len(r.b))), what+" count")
		if r.err != nil {
			return nil
		}
		row.Holders = make([]int, k)
		for j := range row.Holders {
			row.Holders[j] = int(r.uvarint(MaxWorld, what))
		}
	}
	return rows
}

// ecTable decodes the erasure-coding section of a table of nhosts hosts
// and world ranks (nil when K is 0). Only the encoding's shape is checked
// here (DataGroups of one length, as the format has it); Validate checks
// the rest. Every allocation is bounded by the input left.
func (r *reader) ecTable(nhosts, world int) *ECTable {
	k := r.uvarint(MaxECShards-1, "erasure-code K")
	if r.err != nil || k == 0 {
		return nil
	}
	m := r.uvarint(MaxECShards-k, "erasure-code M")
	// A group takes at least 2(K+M)+1+K bytes.
	per := 2*(k+m) + 1 + k
	ng := r.uvarint(min(uint64(nhosts), uint64(len(r.b))/per), "erasure-coding group count")
	if r.err != nil {
		return nil
	}
	ec := &ECTable{K: int(k), M: int(m), Groups: make([]ECGroupRow, ng)}
	ints := func(n uint64, bound uint64, what string) []int {
		if r.err != nil {
			return nil
		}
		if n > uint64(len(r.b)) {
			r.err = malformed("epoch table: truncated %s", what)
			return nil
		}
		xs := make([]int, n)
		for i := range xs {
			xs[i] = int(r.uvarint(bound, what))
		}
		return xs
	}
	for i := range ec.Groups {
		g := &ec.Groups[i]
		g.Hosts = ints(k+m, uint64(nhosts), "erasure-coding host")
		g.Data = ints(k, uint64(nhosts), "erasure-coding data host")
		g.Parity = ints(m, uint64(nhosts), "erasure-coding parity host")
		l := r.uvarint(uint64(world), "erasure-coding data group length")
		if r.err == nil && l*k > uint64(len(r.b)) {
			r.err = malformed("epoch table: truncated erasure-coding data groups")
		}
		if r.err != nil {
			return nil
		}
		g.DataGroups = make([][]int, k)
		for j := range g.DataGroups {
			g.DataGroups[j] = ints(l, MaxWorld, "erasure-coding rank")
		}
	}
	if r.err != nil {
		return nil
	}
	return ec
}
