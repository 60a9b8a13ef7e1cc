package keeper

import (
	"io"
	"math"
	"net"
	"testing"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// TestDiffGetWholeReserve: a diff-mode holder that answers a get with a
// step a lossy codec made inexact restores it whole first (getDiffWhole):
// that copy is reserved against the holder's replica-memory reserve
// before it is allocated. With no room for it the get is refused
// (failNoRoom) and the reserve is unchanged; with room it is answered
// and, once sent, the reserve holds what it held before.
func TestDiffGetWholeReserve(t *testing.T) {
	h := lossyHolder(t)
	get := func() (linkHdr, error) {
		conn, errc := holderConn(t, func(c net.Conn) error {
			return h.store.getDiff(c, linkHdr{kind: kindGet, owner: 0, holder: 1, step: 1})
		})
		a, err := readAnswer(conn)
		if err == nil {
			if _, err = readTable(conn, a.count); err == nil {
				_, err = io.CopyN(io.Discard, conn, int64(a.length))
			}
		}
		if herr := <-errc; herr != nil {
			t.Fatalf("the holder's answer: %v", herr)
		}
		return a, err
	}
	state := uint64(diffRegions[0].Size + 64)
	before := storeBytes(h)
	setLimit(t, h, before+state-1)
	if _, err := get(); !refusedAs(err, failNoRoom) {
		t.Fatalf("a get of an inexact step of %d bytes with %d bytes of room: %v, want failNoRoom", state, state-1, err)
	}
	if n := storeBytes(h); n != before {
		t.Fatalf("the reserve holds %d bytes after a refusal, %d before", n, before)
	}
	setLimit(t, h, before+state)
	a, err := get()
	if err != nil || a.kind != kindData || a.length != state {
		t.Fatalf("a get with room for the restored copy: %+v, %v; want a data answer of %d bytes", a, err, state)
	}
	if n := storeBytes(h); n != before {
		t.Fatalf("the reserve holds %d bytes after the answer, %d before", n, before)
	}
}

// TestDiffGetPiecesReserve: a diff-mode holder that streams an exact
// step (getDiff's pieces) reserves the replay's windows
// (diffstore.PiecesMem) against its replica-memory reserve before the
// stream starts, holds them while it goes, and gives them back once it
// ended; with no room for them the get is refused (failNoRoom) and the
// reserve is unchanged. Before, the stream reserved nothing.
func TestDiffGetPiecesReserve(t *testing.T) {
	h := diffHolder(t, replay.Options{Lossless: true})
	get := func() (linkHdr, error) {
		conn, errc := holderConn(t, func(c net.Conn) error {
			return h.store.getDiff(c, linkHdr{kind: kindGet, owner: 0, holder: 1, step: 1})
		})
		a, err := readAnswer(conn)
		if err == nil {
			var tb []tableEntry
			if tb, err = readTable(conn, a.count); err == nil {
				dst := make([][]byte, len(tb))
				for i, e := range tb {
					dst[i] = make([]byte, e.size)
				}
				err = readPieces(conn, tb, dst, a.step)
			}
		}
		if herr := <-errc; herr != nil {
			t.Fatalf("the holder's answer: %v", herr)
		}
		return a, err
	}
	windows := uint64(diffstore.PiecesMem(diffN, pieceChunk))
	before := storeBytes(h)
	setLimit(t, h, before+windows-1)
	if _, err := get(); !refusedAs(err, failNoRoom) {
		t.Fatalf("a streamed get whose replay takes %d bytes with %d bytes of room: %v, want failNoRoom", windows, windows-1, err)
	}
	if n := storeBytes(h); n != before {
		t.Fatalf("the reserve holds %d bytes after a refusal, %d before", n, before)
	}
	setLimit(t, h, before+windows)
	var during []uint64
	testHookStreamPiece = func(_, _ int, _ string, b []byte) []byte {
		during = append(during, storeBytes(h))
		return b
	}
	t.Cleanup(func() { testHookStreamPiece = nil })
	a, err := get()
	testHookStreamPiece = nil
	if err != nil || a.kind != kindPieces {
		t.Fatalf("a streamed get with room for its replay: %+v, %v; want a pieces answer", a, err)
	}
	if len(during) == 0 {
		t.Fatal("no piece streamed")
	}
	for _, n := range during {
		if n != before+windows {
			t.Fatalf("the reserve held %d bytes while the answer streamed, want %d (%d before, %d for the replay's windows)", n, before+windows, before, windows)
		}
	}
	if n := storeBytes(h); n != before {
		t.Fatalf("the reserve holds %d bytes after the answer, %d before", n, before)
	}
}

// lossyHolder returns host 1 of two in diff mode with a lossy codec
// (int8), holding rank 0's base at step 0 and its differential of step
// 1: a get of step 1 is restored whole (getDiffWhole).
func lossyHolder(t *testing.T) *Keeper {
	return diffHolder(t, replay.Options{Threshold: math.MaxInt}) // int8
}

// diffHolder is lossyHolder with codec: an exact one makes a get of step
// 1 streamed (getDiff's pieces).
func diffHolder(t *testing.T, codec replay.Options) *Keeper {
	t.Helper()
	peers := func(int) []int { return []int{0, 1} }
	c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, func(cfg *Config) {
		diffMod(100, 1000)(cfg)
		cfg.Diff.Codec = codec
	})
	h := c.hosts[1]
	regs, grads := ownerSteps(t, c, 2)
	if err := sendBaseTo(t, h, 0, 0, regs[0]); err != nil {
		t.Fatal(err)
	}
	if err := sendDiffTo(t, h, 1, 0, grads[1], diffHyper(1), codec, regs[1]); err != nil {
		t.Fatal(err)
	}
	return h
}
