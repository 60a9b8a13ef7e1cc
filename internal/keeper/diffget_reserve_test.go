package keeper

import (
	"io"
	"math"
	"net"
	"testing"

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
