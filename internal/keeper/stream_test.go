package keeper

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDiffGetStreamsCommittedBytes: a diff-mode holder's answer to a get
// (streamed from its store, replaying the differentials since its base)
// is the owner's committed bytes at every step it holds, read over a
// link as restoreRemote reads them.
func TestDiffGetStreamsCommittedBytes(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000) // no fold, no refresh: every get replays
	rs := startDiffRanks(t, c, 2, 3)
	runSteps(t, c, rs, 0, 6)
	g := c.publishG()
	if rg := heldRange(c.hosts[1], 0); len(rg) != 1 || rg[0][0] != 0 || rg[0][1] < g {
		t.Fatalf("holder of rank 0 holds %v, want one store from step 0 to at least %d", rg, g)
	}
	for s := int64(0); s <= g; s++ {
		got, err := getFrom(c.hosts[0], 1, 0, s)
		if err != nil {
			t.Fatalf("get of step %d: %v", s, err)
		}
		for name, b := range rs[0].want(s) {
			if !bytes.Equal(got[name], b) {
				t.Errorf("get of step %d: %s differs from the owner's commit", s, name)
			}
		}
	}
}

// TestDiffGetReplayDiffers: a holder whose replay differs from the owner's
// commit (a test hook damages the optimizer region's bytes as they are
// streamed) fails the get, naming rank, step and region, without sending
// the regions after it (the link is closed after the optimizer region's
// last piece); the restoring side refuses
// the bytes (its CRC32C check); a rank restoring Tier-2 then takes its
// state from its other holder, bitwise.
func TestDiffGetReplayDiffers(t *testing.T) {
	var mu sync.Mutex
	damage := -1 // the holder rank whose stream of rank 0's optimizer is damaged; -1: the first asked
	damaged := map[int]int{}
	testHookStreamPiece = func(holder, owner int, region string, b []byte) []byte {
		mu.Lock()
		defer mu.Unlock()
		if owner != 0 || region != "optimizer" {
			return b
		}
		if damage < 0 {
			damage = holder
		}
		if holder != damage {
			return b
		}
		damaged[holder]++
		b = slices.Clone(b)
		b[len(b)/2] ^= 0x10
		return b
	}
	t.Cleanup(func() { testHookStreamPiece = nil })
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newClusterWith(t, [][]int{{0}, {1}, {2}}, [][]int{{1, 2}, {2, 0}, {0, 1}}, peers, diffMod(100, 1000))
	rs := startDiffRanks(t, c, 3, 11)
	runSteps(t, c, rs, 0, 5)
	g := c.publishG()

	// The holder's side: the get fails naming rank, step and region, and
	// nothing of "meta" (after "optimizer") is sent.
	mu.Lock()
	damage = 1
	mu.Unlock()
	server, client := net.Pipe()
	served := make(chan error, 1)
	go func() {
		defer server.Close()
		served <- c.hosts[1].store.getDiff(server, linkHdr{kind: kindGet, owner: 0, holder: 1, step: g})
	}()
	a, err := readAnswer(client)
	if err != nil || a.kind != kindPieces {
		t.Fatalf("answer %+v, %v; want pieces", a, err)
	}
	tab, err := readTable(client, a.count)
	if err != nil {
		t.Fatal(err)
	}
	if tab[0].name != "optimizer" || tab[1].name != "meta" {
		t.Fatalf("table %+v: want optimizer, then meta", tab)
	}
	sent := piecesSent(t, client, len(tab))
	err = <-served
	if want := fmt.Sprintf("rank 0 step %d region optimizer", g); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("getDiff of a replay that differs: %v; want an error naming %q", err, want)
	}
	if sent[0] != tab[0].size || sent[1] != 0 {
		t.Errorf("the holder sent %d bytes of the optimizer and %d of meta, want the optimizer's %d and nothing after", sent[0], sent[1], tab[0].size)
	}

	// The restoring side refuses the bytes.
	if _, err := getFrom(c.hosts[0], 1, 0, g); err == nil || !strings.Contains(err.Error(), "CRC32C") {
		t.Fatalf("get from the holder whose replay differs: %v; want a CRC32C refusal", err)
	}
	if _, err := getFrom(c.hosts[0], 2, 0, g); err != nil {
		t.Fatalf("get from the other holder: %v", err)
	}

	// Host 0 is lost; rank 0 restores Tier-2: the first holder it asks
	// streams a replay that differs, the other its committed state.
	mu.Lock()
	damage, damaged = -1, map[int]int{}
	mu.Unlock()
	c.hosts[0].Close()
	restartWith(t, c, 0, []int{0}, peers, 1, g)
	for r := range rs {
		dr, err := newDiffRank(t, c.hosts[r], r, 11, rs[r].states)
		if err != nil {
			t.Fatal(err)
		}
		defer dr.close()
		res, err := dr.restore(context.Background()) // checks the bytes against the commit
		if err != nil || res.Step != g || r == 0 && res.Tier != 2 {
			t.Fatalf("rank %d restored %+v, %v; want step %d (rank 0 Tier 2)", r, res, err, g)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if damage < 0 || damaged[damage] == 0 {
		t.Fatalf("rank 0's Tier-2 restore asked no holder for its optimizer region (damaged %v)", damaged)
	}
	t.Logf("holder rank %d's replay differed (%d pieces damaged); rank 0 restored from the other", damage, damaged[damage])
}

// getFrom fetches owner's replicated regions at step from holder rank
// holder (on its host) to host from, as restoreRemote does.
func getFrom(from *Keeper, holder, owner int, step int64) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[string][]byte{"optimizer": make([]byte, diffRegions[0].Size), "meta": make([]byte, 64)}
	dst := maps.Clone(got) // fetch deletes what it filled
	host := from.place().hostOf(holder)
	err := from.links.fetch(ctx, host, linkHdr{kind: kindGet, owner: owner, holder: holder, step: step}, []tableEntry{{name: "optimizer"}, {name: "meta"}}, dst)
	return got, err
}

// piecesSent reads the pieces of a pieces answer of count regions until
// the link closes, and returns how many bytes of each region came.
func piecesSent(t *testing.T, r io.Reader, count int) []int64 {
	t.Helper()
	sent := make([]int64, count)
	var ph [pieceHdrSize]byte
	for {
		if _, err := io.ReadFull(r, ph[:]); err != nil {
			return sent
		}
		region, n := int(binary.BigEndian.Uint16(ph[:])), int64(binary.BigEndian.Uint32(ph[10:]))
		if region >= count {
			t.Fatalf("a piece of region %d of %d", region, count)
		}
		if m, _ := io.CopyN(io.Discard, r, n); m != n {
			return sent
		}
		sent[region] += n
	}
}
