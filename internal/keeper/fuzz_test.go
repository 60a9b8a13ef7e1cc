package keeper

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
)

// fuzzHello is the ProtectHello every FuzzSession input's service was
// created with (a gradient buffer of 256 elements).
var fuzzHello = []byte(`{"v":1,"regions":[{"name":"optimizer","size":64},{"name":"params","size":32},{"name":"meta","size":16}],"gradient":256}`)

// Flags of a FuzzSession input's first byte.
const (
	fuzzSayHello = 1 << 0 // the session says fuzzHello first
	fuzzGradient = 1 << 1 // the input's bytes fill the gradient buffer
)

// fuzzInput encodes a FuzzSession input: flags, then frames of a type
// byte, a length byte and the payload.
func fuzzInput(flags byte, frames ...any) []byte {
	b := []byte{flags}
	for i := 0; i < len(frames); i += 2 {
		p := frames[i+1].(string)
		b = append(b, frames[i].(byte), byte(len(p)))
		b = append(b, p...)
	}
	return b
}

// FuzzSession feeds arbitrary sequences of requests into Session.Handle
// of a rank whose service already protects regions (one host, no
// replicas; the test plays the launcher and publishes G after every
// request, so Stage never waits). It checks that nothing panics or hangs,
// that Handle returns an error exactly for the requests that are
// malformed by the package's own decoding and checks (never for a
// well-formed one it cannot do), that answers are of the request's type
// and encode to JSON that decodes back strictly, that Status stays
// consistent, and that afterwards a fresh session of the rank works:
// ProtectHello with the same regions, then Stage and Commit of the next
// step.
//
// Input: byte 0 holds flags (fuzzSayHello, fuzzGradient); then frames of
// a type byte (with the high bit set, 16 + the low bits mod 12: a
// request or an answer type of the protocol; else the byte as is), a
// length byte and that many bytes of payload. After a malformed request
// the session goes on with a new Session, as a rank that reconnects.
// Each input starts from empty slots (Keeper.Restart from scratch).
func FuzzSession(f *testing.F) {
	c := newCluster(f, [][]int{{0}}, nil, nil)
	h := c.hosts[0]
	_, ans, err := h.Session(0).Handle(context.Background(), protect.TypeProtectHello, fuzzHello)
	if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
		f.Fatalf("hello: %+v, %v", ans, err)
	}
	gf := ans.(*protect.ProtectWelcome).Gradient
	gviews, unmap, err := ckpt.MapData(ckpt.RegionFile{Name: protect.GradientRegion, Size: gf.Size, Stride: (gf.Size + 4095) &^ 4095, Path: gf.Path})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { unmap() })
	grad := gviews[0]

	hello := string(fuzzHello)
	f.Add(fuzzInput(fuzzSayHello))
	f.Add(fuzzInput(0, protect.TypeProtectHello, hello, protect.TypeStatus, `{}`))
	f.Add(fuzzInput(fuzzSayHello,
		protect.TypeStage, `{"step":0}`, protect.TypeCommit, `{"step":0}`,
		protect.TypeStage, `{"step":1}`, protect.TypeCommit, `{"step":1}`,
		protect.TypeStage, `{"step":2}`, protect.TypeCommit, `{"step":2}`,
		protect.TypeStatus, `{}`, protect.TypeRestore, `{}`, protect.TypeStage, `{"step":3}`, protect.TypeCommit, `{"step":3}`))
	f.Add(fuzzInput(fuzzSayHello|fuzzGradient, protect.TypeStage, `{"step":5}`, protect.TypeCommit, `{"step":5}`,
		protect.TypeGradient, `{"step":5,"n":64}`, protect.TypeGradient, `{"step":6,"n":256}`, protect.TypeGradient, `{"step":6,"n":257}`))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeRestore, `{}`, protect.TypeStage, `{"step":9007199254740991}`, protect.TypeCommit, `{"step":9007199254740991}`))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeCommit, `{"step":4}`, protect.TypeStage, `{"step":4}`, protect.TypeStage, `{"step":5}`, protect.TypeCommit, `{"step":4}`))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":65}]}`, protect.TypeStatus, `{}`))
	f.Add(fuzzInput(0, protect.TypeStage, `{"step":1}`, protect.TypeProtectHello, `{"v":1,"regions":[{"name":"hdr","size":1}]}`))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeStage, `{"step":-1}`, protect.TypeStage, `{"step":1,"n":3}`, protect.TypeGradient, `{"step":1,"n":-1}`))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeStage, `{"step":1,"x":2}`, protect.TypeRestore, `{"step":1}`, protect.TypeStatus, `[]`, protect.TypeStage, ``))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeStaged, `{"step":1}`, byte(99), `{}`, byte(5), `{"err":"x"}`, byte(0), ``))
	f.Add(fuzzInput(fuzzSayHello, protect.TypeStage, `{"step":1e3}`, protect.TypeStage, `{"step":"1"}`, protect.TypeStage, `{"step":1.5}`, protect.TypeStage, `null`))
	f.Add([]byte("\x01\x92\x0a{\"step\":7}\x94\x0a{\"step\":7}"))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})

	var gen uint64
	f.Fuzz(func(t *testing.T, in []byte) {
		gen++
		if err := h.Restart(gen, -1); err != nil {
			t.Fatalf("restart: %v", err)
		}
		if len(in) == 0 {
			return
		}
		flags, in := in[0], in[1:]
		if flags&fuzzGradient != 0 {
			clear(grad)
			copy(grad, in)
		}
		sess := h.Session(0)
		hello := false
		call := func(typ byte, b []byte) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			at, ans, err := sess.Handle(ctx, typ, b)
			if want := malformed(typ, b, hello); (err != nil) != (want != nil) {
				t.Fatalf("type %d %q: Handle says %v; the package's checks say %v", typ, b, err, want)
			}
			if err != nil {
				if at != 0 || ans != nil {
					t.Fatalf("type %d %q: error %v with an answer %d %+v", typ, b, err, at, ans)
				}
				sess, hello = h.Session(0), false // the connection is closed
				return
			}
			checkAnswer(t, typ, b, at, ans)
			if e := errField(ans); strings.Contains(e, "waiting for step") {
				t.Fatalf("type %d %q waited at the overwrite rule although G is published: %s", typ, b, e)
			}
			if w, ok := ans.(*protect.ProtectWelcome); ok && w.Err == "" {
				hello = true
			}
			// The launcher: G is the rank's Replicated (no replicas).
			pgen, ps := h.Progress()
			if ps[0].Replicated > ps[0].Committed || ps[0].Committed > protect.MaxStep {
				t.Fatalf("progress %+v", ps[0])
			}
			h.SetG(pgen, ps[0].Replicated)
		}
		if flags&fuzzSayHello != 0 {
			call(protect.TypeProtectHello, fuzzHello)
		}
		for len(in) >= 2 {
			typ, n := in[0], int(in[1])
			if typ&0x80 != 0 {
				typ = 16 + (typ&0x7f)%12
			}
			in = in[2:]
			n = min(n, len(in))
			call(typ, in[:n])
			in = in[n:]
		}

		// A rank connecting again gets its state and may go on.
		sess, hello = h.Session(0), false
		ctx := context.Background()
		_, ans, err := sess.Handle(ctx, protect.TypeProtectHello, fuzzHello)
		if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
			t.Fatalf("hello again: %+v, %v", ans, err)
		}
		next := ans.(*protect.ProtectWelcome).Committed + 1
		if next > protect.MaxStep {
			return
		}
		req := fmt.Appendf(nil, `{"step":%d}`, next)
		if _, ans, err := sess.Handle(ctx, protect.TypeStage, req); err != nil || ans.(*protect.Staged).Err != "" {
			t.Fatalf("Stage(%d) after the input: %+v, %v", next, ans, err)
		}
		if _, ans, err := sess.Handle(ctx, protect.TypeCommit, req); err != nil || ans.(*protect.Committed).Err != "" {
			t.Fatalf("Commit(%d) after the input: %+v, %v", next, ans, err)
		}
	})
}

// malformed says why a request is malformed by the protocol (the
// package's own decoding and checks), or nil if it is well-formed.
func malformed(typ byte, b []byte, hello bool) error {
	if typ != protect.TypeProtectHello && !hello {
		return fmt.Errorf("type %d before ProtectHello", typ)
	}
	switch typ {
	case protect.TypeProtectHello:
		var req protect.ProtectHello
		if err := decode(b, &req); err != nil {
			return err
		}
		return req.Check()
	case protect.TypeStage, protect.TypeCommit, protect.TypeGradient:
		var req protect.StepReq
		if err := decode(b, &req); err != nil {
			return err
		}
		if err := protect.CheckStep(req.Step); err != nil {
			return err
		}
		if typ != protect.TypeGradient && req.N != 0 || req.N < 0 || req.N > protect.MaxGradient {
			return fmt.Errorf("n = %d", req.N)
		}
		return nil
	case protect.TypeRestore, protect.TypeStatus:
		var req protect.Empty
		return decode(b, &req)
	}
	return fmt.Errorf("type %d is not a request", typ)
}

// checkAnswer checks that an answer is of the request's type, and that
// it encodes as the service sends it and decodes back strictly.
func checkAnswer(t *testing.T, typ byte, req []byte, at byte, ans any) {
	t.Helper()
	var fresh any
	ok := false
	switch typ {
	case protect.TypeProtectHello:
		_, ok = ans.(*protect.ProtectWelcome)
		fresh = &protect.ProtectWelcome{}
	case protect.TypeStage:
		_, ok = ans.(*protect.Staged)
		fresh = &protect.Staged{}
	case protect.TypeCommit:
		_, ok = ans.(*protect.Committed)
		fresh = &protect.Committed{}
	case protect.TypeGradient:
		_, ok = ans.(*protect.GradientDone)
		fresh = &protect.GradientDone{}
	case protect.TypeRestore:
		_, ok = ans.(*protect.Restorable)
		fresh = &protect.Restorable{}
	case protect.TypeStatus:
		_, ok = ans.(*protect.Status)
		fresh = &protect.Status{}
	}
	if !ok || at != typ+1 {
		t.Fatalf("request %d %q answered with type %d, %T", typ, req, at, ans)
	}
	b, err := json.Marshal(ans)
	if err != nil {
		t.Fatalf("answer %+v: %v", ans, err)
	}
	if err := wire.DecodeSock(b, fresh); err != nil {
		t.Fatalf("answer %s does not decode: %v", b, err)
	}
	switch a := ans.(type) {
	case *protect.Staged:
		if a.Err == "" && a.Slot != 0 && a.Slot != 1 {
			t.Fatalf("staged in slot %d", a.Slot)
		}
	case *protect.Restorable:
		if a.Err == "" && a.Step >= 0 && (a.Slot != 0 && a.Slot != 1 || a.Tier != 1) {
			t.Fatalf("restorable %+v", a)
		}
	case *protect.Status:
		if a.Replicated > a.Committed || a.G > a.Committed || a.Stages < 0 || a.WaitNS < 0 {
			t.Fatalf("status %+v", a)
		}
	}
}

// FuzzLinkFrames feeds random bytes to the replication link's parsers:
// parseLinkHdr (the first 40 bytes, zero-padded), readTable (the rest,
// with the header's count when it parsed, else a count from the input)
// and readAnswer. None may panic; what they accept must be within the
// protocol's bounds and encode back to what was read; and reading must
// not allocate more than the bounds allow (at most 16 entries of names of
// at most 32 bytes, failure messages of at most 4 KiB), whatever the
// counts and lengths claim.
func FuzzLinkFrames(f *testing.F) {
	hdr := func(h linkHdr) []byte {
		b := make([]byte, linkHdrSize)
		h.put(b)
		return b
	}
	tbl := []tableEntry{{"optimizer", 3000, 0xdeadbeef}, {"meta", 100, 1}}
	f.Add(append(hdr(linkHdr{kind: kindPut, count: 2, owner: 3, holder: 5, step: 7, gen: 1, length: 3100}), appendTable(nil, tbl)...))
	f.Add(append(hdr(linkHdr{kind: kindGet, count: 1, owner: 3, holder: 5, step: 7}), appendTable(nil, tbl[:1])...))
	f.Add(append(hdr(linkHdr{kind: kindGetSlot, count: 1, owner: 3, holder: 4, step: -1}), appendTable(nil, []tableEntry{{"params", 0, 0}})...))
	f.Add(hdr(linkHdr{kind: kindAck, owner: 1, holder: 2, step: 9}))
	f.Add(append(hdr(linkHdr{kind: kindFail, owner: 1, holder: 2, step: 9, length: 5}), "nope!"...))
	f.Add(hdr(linkHdr{kind: kindFail, length: 1 << 40}))
	f.Add(hdr(linkHdr{kind: kindPut, count: 65535, owner: 1 << 31, step: math.MaxInt64}))
	f.Add(append(hdr(linkHdr{kind: kindPut, count: 2}), appendTable(nil, []tableEntry{{"a", 1, 0}, {"a", 1, 0}})...))
	f.Add(append(hdr(linkHdr{kind: kindPut, count: 1}), 0xff, 'a'))
	// A logBegin: a base's header and table, then the optimizer
	// descriptor and the owner's epoch.
	lb := append(hdr(linkHdr{kind: kindBase, count: 2, owner: 3, holder: 5, step: 7, gen: 1, length: logBeginSize}), appendTable(nil, tbl)...)
	lb = appendOptDesc(lb, 0, &protect.Optimizer{Region: "optimizer", N: 250, W: 0, M: 1000, V: 2000})
	f.Add(binary.BigEndian.AppendUint64(lb, 9))
	// The same with the descriptor's reserved bytes not zero (refused).
	lbr := slices.Clone(lb)
	lbr[len(lbr)-optDescSize+7] = 1
	f.Add(binary.BigEndian.AppendUint64(lbr, 9))
	// A base's first frame: the descriptor, then the regions' bytes.
	bf := append(hdr(linkHdr{kind: kindBase, count: 2, owner: 3, holder: 5, step: 7, gen: 1, length: optDescSize + tableBytes(tbl)}), appendTable(nil, tbl)...)
	f.Add(appendOptDesc(bf, 1, &protect.Optimizer{Region: "meta", N: 25, W: 0, M: 100, V: 200}))
	f.Add([]byte{})
	f.Add([]byte{linkMagic})

	f.Fuzz(func(t *testing.T, in []byte) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc

		hb := make([]byte, linkHdrSize)
		copy(hb, in)
		rest := in[min(len(in), linkHdrSize):]
		h, err := parseLinkHdr(hb)
		hdrOK := err == nil
		n := int(hb[2]) % (protect.MaxRegions + 1)
		if err == nil {
			if hb[0] != linkMagic || h.count < 0 || h.count > protect.MaxRegions || h.owner < 0 || h.owner > 1<<30 ||
				h.holder < 0 || h.holder > 1<<30 || h.step < noStep || h.step > protect.MaxStep {
				t.Fatalf("accepted header %+v", h)
			}
			b := make([]byte, linkHdrSize)
			h.put(b)
			if g, err := parseLinkHdr(b); err != nil || g != h {
				t.Fatalf("header %+v encodes to one that parses as %+v, %v", h, g, err)
			}
			if !bytes.Equal(b[:12], hb[:12]) || !bytes.Equal(b[16:], hb[16:]) {
				t.Fatalf("header %x encodes back as %x", hb, b)
			}
			n = h.count
		}
		tb, err := readTable(bytes.NewReader(rest), n)
		if err == nil {
			if len(tb) != n {
				t.Fatalf("%d entries for %d", len(tb), n)
			}
			names := map[string]bool{}
			for _, e := range tb {
				if !ckpt.ValidRegionName(e.name) || e.size < 0 || e.size > protect.MaxRegionSize || names[e.name] {
					t.Fatalf("accepted entry %+v of %+v", e, tb)
				}
				names[e.name] = true
			}
			enc := appendTable(nil, tb)
			if !bytes.HasPrefix(rest, enc) {
				t.Fatalf("table %+v encodes as %x, read from %x", tb, enc, rest)
			}
			if again, err := readTable(bytes.NewReader(enc), n); err != nil || !slices.Equal(again, tb) {
				t.Fatalf("table %+v reads back as %+v, %v", tb, again, err)
			}
			if hdrOK && (h.length == logBeginSize || h.length == optDescSize+tableBytes(tb)) {
				// A logBegin or a base's first frame: the optimizer
				// descriptor follows the table.
				checkOptDesc(t, rest[len(enc):], tb)
			}
		}
		a, err := readAnswer(bytes.NewReader(in))
		if err == nil && a.kind == kindFail {
			t.Fatalf("a failure answer read as %+v", a)
		}
		if re, ok := err.(*remoteError); ok && len(re.msg) > maxFailMsg {
			t.Fatalf("failure message of %d bytes", len(re.msg))
		}

		runtime.ReadMemStats(&ms)
		// Two tables and their copies, a failure message, the header
		// buffers and the input's copies, with room for the runtime.
		if got, limit := ms.TotalAlloc-before, uint64(64<<10+4*len(in)); got > limit {
			t.Fatalf("parsing %d bytes allocated %d bytes (limit %d)", len(in), got, limit)
		}
	})
}

// TestReadTableCount: readTable's count comes from a header that
// parseLinkHdr bounded to MaxRegions (and a 16-bit field), so readTable
// itself trusts it and allocates that many entries before reading any.
// Latent: no caller passes more today, but a huge count panics rather
// than being refused.
func TestReadTableCount(t *testing.T) {
	if _, err := readTable(bytes.NewReader(nil), protect.MaxRegions); err == nil {
		t.Fatal("a table of 16 entries read from nothing")
	}
	var hb [linkHdrSize]byte
	(&linkHdr{kind: kindPut, count: protect.MaxRegions + 1}).put(hb[:])
	if _, err := parseLinkHdr(hb[:]); err == nil {
		t.Fatal("a header of 17 regions accepted")
	}
	binary.BigEndian.PutUint16(hb[2:], 0xffff)
	if _, err := parseLinkHdr(hb[:]); err == nil {
		t.Fatal("a header of 65535 regions accepted")
	}
	t.Run("huge", func(t *testing.T) {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("readTable(1<<40) panicked: %v", p)
			}
		}()
		if _, err := readTable(bytes.NewReader(nil), 1<<40); err == nil {
			t.Fatal("readTable(1<<40) accepted")
		}
	})
}

// checkOptDesc checks parseOptDesc of db (the bytes after a frame's
// table tb) against the descriptor's layout: it does not panic, and
// accepts only a descriptor of optDescSize bytes or more whose region
// index is one of tb's and whose reserved bytes are zero, read as they
// are laid out.
func checkOptDesc(t *testing.T, db []byte, tb []tableEntry) {
	t.Helper()
	opt, err := parseOptDesc(db, tb)
	if err != nil {
		return
	}
	if len(db) < optDescSize {
		t.Fatalf("a descriptor of %d bytes accepted as %+v", len(db), opt)
	}
	idx, reserved := binary.BigEndian.Uint32(db), binary.BigEndian.Uint32(db[4:])
	if reserved != 0 || idx >= uint32(len(tb)) {
		t.Fatalf("descriptor %x (region %d of %d, reserved %#x) accepted as %+v", db[:optDescSize], idx, len(tb), reserved, opt)
	}
	u64 := func(i int) int64 { return int64(binary.BigEndian.Uint64(db[i:])) }
	if opt.Region != tb[idx].name || opt.N != u64(8) || opt.WOff != u64(16) || opt.MOff != u64(24) || opt.VOff != u64(32) {
		t.Fatalf("descriptor %x read as %+v", db[:optDescSize], opt)
	}
}
