package keeper

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/crc32c"
)

// stepFrame is rank 0's step of propRegions (those in only, if not nil),
// filled with fill+i, as its host would send it to rank 1 on h: the
// put's header, table, data and encoded frame.
func stepFrame(t *testing.T, h *Keeper, step int64, fill byte, only map[string][]byte) (linkHdr, []tableEntry, [][]byte, []byte) {
	t.Helper()
	var tab []tableEntry
	var data [][]byte
	for i, reg := range propRegions {
		if only != nil && only[reg.Name] == nil {
			continue
		}
		d := bytes.Repeat([]byte{fill + byte(i)}, int(reg.Size))
		tab = append(tab, tableEntry{name: reg.Name, size: reg.Size, sum: crc32c.Checksum(d)})
		data = append(data, d)
	}
	hdr := linkHdr{kind: kindPut, owner: 0, holder: 1, step: step, gen: h.Gen()}
	var frame bytes.Buffer
	if err := writeFrame(&frame, hdr, tab, data); err != nil {
		t.Fatal(err)
	}
	return hdr, tab, data, frame.Bytes()
}

// holderOfRank0 starts hosts 0 and 1, each holding the other's rank's
// replicas, protects steps 0 to 2, and returns host 1.
func holderOfRank0(t *testing.T) *Keeper {
	t.Helper()
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2)
	return c.hosts[1]
}

// putAcked sends put hdr of tab and data on l and fails t unless it is
// acknowledged (within 10 s).
func putAcked(t *testing.T, what string, l io.ReadWriter, hdr linkHdr, tab []tableEntry, data [][]byte) {
	t.Helper()
	within(t, what, func() error {
		if err := writeFrame(l, hdr, tab, data); err != nil {
			return err
		}
		return readAck(l, hdr)
	})
}

// TestTakeOverStalledPuts: puts of one step on link after link, each
// stalling mid-frame (a flapping partition), each taking the buffer the
// one before is receiving into over: each taken-over put is ended at
// once (its link closed), so its slices live no longer than they are
// counted, and the store counts one buffer's worth, not one per link.
func TestTakeOverStalledPuts(t *testing.T) {
	h1 := holderOfRank0(t) // host 1 holds rank 0's steps 0 and 1
	hdr, tab, _, frame := stepFrame(t, h1, 2, 0x40, nil)
	size := tableBytes(tab)
	// The header, the table and half the first region: once the write
	// returns (net.Pipe), the holder has claimed a buffer and is reading
	// the rest of the data.
	half := len(frame) - int(size) + int(tab[0].size)/2

	links := &pipeLinks{}
	t.Cleanup(links.close)
	var before uint64 // with one put receiving (the first may reshape its buffer)
	var prev io.ReadWriter
	for i := range 8 {
		l := links.serve(h1, 0)
		if _, err := l.Write(frame[:half]); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			before = storeBytes(h1)
		}
		// The stalled put before, its buffer taken over, still counted
		// unless it has ended already.
		if got := storeBytes(h1); got != before && got != before+size {
			t.Fatalf("link %d: the store counts %d bytes, want %d or %d (with the slices of the put taken over)", i, got, before, before+size)
		}
		if prev != nil {
			within(t, "the end of the put taken over", func() error {
				_, err := io.ReadAll(prev) // until the holder closes the link
				return err
			})
			if got := storeBytes(h1); got != before {
				t.Fatalf("link %d: the store counts %d bytes with one put receiving, want %d", i, got, before)
			}
		}
		prev = l
	}
	within(t, "the last put's end", func() error {
		if _, err := prev.Write(frame[half:]); err != nil {
			return err
		}
		return readAck(prev, hdr)
	})
	if got := storeBytes(h1); got != before {
		t.Errorf("the store counts %d bytes after the last put, want %d", got, before)
	}
	if got := replicaRegions(h1, 0, 2); len(got) != len(tab) {
		t.Errorf("host 1 holds %d regions of rank 0's step 2, want %d", len(got), len(tab))
	}
}

// TestTakeOverOverLimit: a put that would take over the buffer a
// stalled put receives into, when new slices would not fit within the
// store's limit besides the ones still in use, is refused (its sender
// tries again), not given memory outside the limit; the stalled put is
// ended, so that the retry finds the buffer free and receives into it.
func TestTakeOverOverLimit(t *testing.T) {
	h1 := holderOfRank0(t) // host 1 holds rank 0's steps 0 and 1
	hdr, tab, data, frame := stepFrame(t, h1, 2, 0x30, nil)
	half := len(frame) - int(tableBytes(tab)) + int(tab[0].size)/2
	links := &pipeLinks{}
	t.Cleanup(links.close)
	stalled := links.serve(h1, 0)
	if _, err := stalled.Write(frame[:half]); err != nil {
		t.Fatal(err)
	}
	before := storeBytes(h1)
	h1.store.mu.Lock()
	h1.store.limit = before + tableBytes(tab) - 1
	h1.store.mu.Unlock()

	other := links.serve(h1, 0)
	var err error
	within(t, "a put of rank 0's step 2 while another is stalled", func() error {
		if err := writeFrame(other, hdr, tab, data); err != nil {
			return err
		}
		err = readAck(other, hdr)
		return nil
	})
	if re, ok := errors.AsType[*remoteError](err); !ok || !strings.Contains(re.msg, "limit") {
		t.Fatalf("a put needing new slices past the limit: %v, want a refusal naming the limit", err)
	}
	if got := storeBytes(h1); got != before {
		t.Errorf("after the refusal the store counts %d bytes, want %d", got, before)
	}
	within(t, "the end of the stalled put", func() error {
		_, err := io.ReadAll(stalled)
		return err
	})
	putAcked(t, "the put tried again", other, hdr, tab, data)
	if got := storeBytes(h1); got != before {
		t.Errorf("after the put tried again the store counts %d bytes, want %d", got, before)
	}
	if got := replicaRegions(h1, 0, 2); len(got) != len(tab) {
		t.Errorf("host 1 holds %d regions of rank 0's step 2, want %d", len(got), len(tab))
	}
}

// TestTakeOverStalledGet: a put that takes over a buffer a stalled get
// is sending gives the buffer new slices; the get's stay alive, and
// counted, until it ends.
func TestTakeOverStalledGet(t *testing.T) {
	h1 := holderOfRank0(t) // host 1 holds rank 0's steps 0 and 1
	held := replicaRegions(h1, 0, 1)
	before := storeBytes(h1)

	links := &pipeLinks{}
	t.Cleanup(links.close)
	stalled, get, first := stallGet(t, links, h1, 1)
	put, tab, data, _ := stepFrame(t, h1, 1, 0x70, held)
	other := links.serve(h1, 0)
	putAcked(t, "a put of rank 0's step 1 while a get of it is stalled", other, put, tab, data)
	if got, want := storeBytes(h1), before+tableBytes(tab); got != want {
		t.Errorf("with a stalled get sending the slices taken over: the store counts %d bytes, want %d", got, want)
	}

	// The get read at last, and a refused get after it on its link: the
	// first has ended and let its slices go.
	dst := map[string][]byte{}
	for name, b := range held {
		dst[name] = make([]byte, len(b))
	}
	if err := readFetched(io.MultiReader(bytes.NewReader(first), stalled), get, maps.Clone(dst)); err != nil {
		t.Fatalf("the stalled get: %v", err)
	}
	none := get
	none.step = 99
	if err := writeFrame(stalled, none, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := readFetched(stalled, none, maps.Clone(dst)); err == nil {
		t.Fatal("a get of a step not held was answered")
	}
	if got := storeBytes(h1); got != before {
		t.Errorf("after the stalled get ended: the store counts %d bytes, want %d", got, before)
	}
}

// TestHasChecksOutsideLock: a has checks the held bytes' CRC32Cs with
// the buffer pinned, not under the owner's lock (a full pass over a
// large replica would hold up every request on it); a copy rotten since
// its put is still dropped and refused.
func TestHasChecksOutsideLock(t *testing.T) {
	for _, tc := range []struct {
		name string
		rot  bool
	}{
		{"good copy", false},
		{"rotten copy", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h1 := holderOfRank0(t) // host 1 holds rank 0's steps 0 and 1
			hdr, tab, data, _ := stepFrame(t, h1, 2, 0x20, nil)
			links := &pipeLinks{}
			t.Cleanup(links.close)
			l := links.serve(h1, 0)
			putAcked(t, "a put of rank 0's step 2", l, hdr, tab, data)
			if tc.rot {
				o := h1.store.owner(0)
				o.mu.Lock()
				for i := range o.bufs {
					if b := &o.bufs[i]; b.step == 2 {
						b.data[0][0] ^= 1
					}
				}
				o.mu.Unlock()
			}
			checks, free := 0, 0
			testHookHasCheck = func(o *ownerReplica) {
				checks++
				if o.mu.TryLock() {
					free++
					o.mu.Unlock()
				}
			}
			t.Cleanup(func() { testHookHasCheck = nil })
			has := hdr
			has.kind = kindHas
			var err error
			within(t, "a has of rank 0's step 2", func() error {
				if err := writeFrame(l, has, tab, nil); err != nil {
					return err
				}
				err = readAck(l, has)
				return nil
			})
			if checks != 1 || free != 1 {
				t.Errorf("the has checked %d times, %d of them with the owner's lock free; want 1, 1", checks, free)
			}
			_, refused := errors.AsType[*remoteError](err)
			switch {
			case tc.rot && (!refused || !strings.Contains(err.Error(), "CRC32C")):
				t.Errorf("a has of a rotten copy: %v, want a refusal naming the CRC32C", err)
			case !tc.rot && err != nil:
				t.Errorf("a has of a good copy: %v", err)
			}
			if got := replicaRegions(h1, 0, 2); tc.rot == (len(got) != 0) {
				t.Errorf("after the has, host 1 holds %d regions of rank 0's step 2 (rotten %v)", len(got), tc.rot)
			}
		})
	}
}

// TestHasStalledAnswer: a has whose answer is not read (its reader
// stalled) does not hold the owner's lock: a put of the owner on another
// link goes through meanwhile.
func TestHasStalledAnswer(t *testing.T) {
	h1 := holderOfRank0(t) // host 1 holds rank 0's steps 0 and 1
	hdr, tab, data, _ := stepFrame(t, h1, 2, 0x50, nil)
	links := &pipeLinks{}
	t.Cleanup(links.close)
	l := links.serve(h1, 0)
	putAcked(t, "a put of rank 0's step 2", l, hdr, tab, data)
	has := hdr
	has.kind = kindHas
	if err := writeFrame(l, has, tab, nil); err != nil { // its answer is read last
		t.Fatal(err)
	}
	put3, tab3, data3, _ := stepFrame(t, h1, 3, 0x60, nil)
	other := links.serve(h1, 0)
	putAcked(t, "a put of rank 0's step 3 while a has's answer is not read", other, put3, tab3, data3)
	within(t, "the has's answer", func() error { return readAck(l, has) })
}
