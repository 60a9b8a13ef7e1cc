package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// The PMI-1 client library Open MPI ranks load (libpmi/gorun_pmi.c)
// escapes what the simple protocol cannot carry. FuzzPMIEscape runs it,
// built with gcc, in a C driver connected to a real pmiConn whose
// barriers are real fences of a rankSockets over a control plane: any
// NUL-free key and value a program puts come back unchanged from get
// after a barrier, or the put fails with the length error exactly when
// the escaped form is too long; the server never sees a malformed line.

// PMI-1's return codes the driver reports (libpmi/pmi.h).
const (
	pmiSuccess          = 0
	pmiErrInvalidKey    = 4
	pmiErrInvalidKeyLen = 5
	pmiErrInvalidValLen = 7
)

// escapedKeyLen and escapedValueLen are the lengths of the library's
// escapes: keys keep [a-z0-9], values the bytes 0x21-0x7e but '%'; every
// other byte takes three.
func escapedKeyLen(k string) int {
	n := 0
	for _, c := range []byte(k) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			n++
		} else {
			n += 3
		}
	}
	return n
}

func escapedValueLen(v string) int {
	n := 0
	for _, c := range []byte(v) {
		if c >= 0x21 && c <= 0x7e && c != '%' {
			n++
		} else {
			n += 3
		}
	}
	return n
}

// buildLibPMI builds libgorun-pmi.so and the driver into dir with gcc
// (skipping without it, unless GORUN_TESTCLUSTER_REQUIRE=1).
func buildLibPMI(tb testing.TB, dir string) (driver string) {
	tb.Helper()
	gcc := gortest.Tool(tb, "gcc", "apt-get install gcc: it builds the PMI-1 client library")
	libdir, err := filepath.Abs(filepath.Join("..", "..", "libpmi"))
	if err != nil {
		tb.Fatal(err)
	}
	so := filepath.Join(dir, "libgorun-pmi.so")
	driver = filepath.Join(dir, "pmidriver")
	for _, args := range [][]string{
		libPMIArgs(tb, libdir, so),
		{"-O1", "-Wall", "-Werror", "-I", libdir, "-o", driver, filepath.Join("testdata", "pmidriver.c"), so, "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			tb.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return driver
}

// libPMIArgs is gcc's arguments building libgorun-pmi.so at so from every
// .c file in libdir (libpmi/).
func libPMIArgs(tb testing.TB, libdir, so string) []string {
	tb.Helper()
	srcs, err := filepath.Glob(filepath.Join(libdir, "*.c"))
	if err != nil || len(srcs) == 0 {
		tb.Fatalf("libpmi sources in %s: %v (%d found)", libdir, err, len(srcs))
	}
	args := []string{"-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror", "-o", so}
	return append(append(args, srcs...), "-lpthread")
}

// pmiDriver is one running driver and the server side of its rank.
type pmiDriver struct {
	in        io.Writer
	out       *bufio.Reader
	served    chan error // the pmiConn's end
	announced int        // PMI_KVS_Get_value_length_max
	broken    error      // a read that failed: the driver's answers are out of step
	gets      *getCounter
	writes    *countingWriter // the server's writes to the rank
}

// getCounter counts the get requests read from a rank.
type getCounter struct {
	r    io.Reader
	mu   sync.Mutex
	line []byte // the start of the line being read (up to 8 bytes)
	n    int
}

func (g *getCounter) Read(b []byte) (int, error) {
	n, err := g.r.Read(b)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range b[:n] {
		if c == '\n' {
			g.line = g.line[:0]
			continue
		}
		if len(g.line) < 8 {
			if g.line = append(g.line, c); string(g.line) == "cmd=get " {
				g.n++
			}
		}
	}
	return n, err
}

// count returns the number of get requests read so far.
func (g *getCounter) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// startPMIDriver starts the driver as rank 0 of a one-rank job whose
// fences go through a control plane to a launcher that merges them.
func startPMIDriver(tb testing.TB, driver string) *pmiDriver {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	const job = "libpmi"
	l, _, dial := testControlPlane(tb, ctx, job)
	ctl, err := dial(ctx, control.ControlOptions{Name: "h0"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(ctl.Close)
	subj := wire.JobSubjects(job)
	// The launcher's part of a fence with one host: its keys are the
	// merged result.
	if _, err := l.Subscribe(subj.UpFence, func(m *nats.Msg) {
		uf, err := wire.DecodeUpFence(m.Data)
		if err != nil {
			tb.Errorf("fence: %v", err)
			return
		}
		_ = l.Publish(subj.Fence, wire.Marshal(&wire.Fence{Epoch: uf.Epoch, Seq: uf.Seq, KV: uf.KV}))
	}); err != nil {
		tb.Fatal(err)
	}
	s := &rankSockets{
		job: job, log: slog.New(slog.DiscardHandler), nc: ctl.Conn, subj: subj.ForHost(0), stop: make(chan struct{}),
		world: 1, local: 1, conns: map[net.Conn]*rankConn{}, nextSeq: map[int]int{}, fences: map[int]*hostFence{},
	}
	if _, err := ctl.Subscribe(subj.Fence, s.fenceDone); err != nil {
		tb.Fatal(err)
	}
	if err := ctl.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		tb.Fatal(err)
	}
	mine, theirs, err := pmiSocketPair()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(driver)
	cmd.Env = []string{"PMI_FD=3", "PMI_RANK=0", "PMI_SIZE=1"}
	cmd.ExtraFiles = []*os.File{theirs}
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	theirs.Close()
	kvs := &pmiKVS{kv: map[string]string{}, merged: -1}
	gets, writes := &getCounter{r: mine}, &countingWriter{w: mine}
	rw := struct {
		io.Reader
		io.Writer
	}{gets, writes}
	c := &pmiConn{s: s, kvs: kvs, size: 1, kvsname: "gorun-" + job, rw: rw, pending: map[string]string{},
		aborted: func(int, string) {}, failed: func(string) {}, session: func(int32) {}}
	d := &pmiDriver{in: in, out: bufio.NewReader(out), served: make(chan error, 1), gets: gets, writes: writes}
	go func() { d.served <- c.serve(); mine.Close() }()
	tb.Cleanup(func() {
		in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		close(s.stop)
	})
	var vmax int32
	if err := d.read(&vmax); err != nil {
		tb.Fatalf("the driver did not initialize PMI: %v", err)
	}
	d.announced = int(vmax)
	return d
}

// read reads one answer of the driver, or fails if the server ended.
func (d *pmiDriver) read(v any) error {
	if d.broken != nil {
		return d.broken
	}
	done := make(chan error, 1)
	go func() { done <- binary.Read(d.out, binary.LittleEndian, v) }()
	select {
	case err := <-done:
		if err != nil {
			d.broken = err
		}
		return err
	case err := <-d.served:
		d.served <- err
		d.broken = fmt.Errorf("the PMI server ended the connection: %w", err)
	case <-time.After(10 * time.Second):
		d.broken = errors.New("no answer from the driver in 10 s")
	}
	return d.broken
}

// roundTrip puts key=value, enters a barrier and gets key: the three
// return codes and the value got.
func (d *pmiDriver) roundTrip(key, value string) (rc [3]int32, got string, err error) {
	return d.request(key, &value, true)
}

// request puts key=value unless value is nil, enters a barrier if barrier
// is set (and there was a put), and gets key: the three return codes and
// the value got.
func (d *pmiDriver) request(key string, value *string, barrier bool) (rc [3]int32, got string, err error) {
	klen := uint32(len(key))
	if !barrier {
		klen |= 1 << 31
	}
	req := binary.LittleEndian.AppendUint32(nil, klen)
	req = append(req, key...)
	if value == nil {
		req = binary.LittleEndian.AppendUint32(req, 0xffffffff)
	} else {
		req = binary.LittleEndian.AppendUint32(req, uint32(len(*value)))
		req = append(req, *value...)
	}
	if _, err := d.in.Write(req); err != nil {
		return rc, "", err
	}
	if err := d.read(&rc); err != nil {
		return rc, "", err
	}
	var n uint32
	if err := d.read(&n); err != nil {
		return rc, "", err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.out, b); err != nil {
		return rc, "", err
	}
	return rc, string(b), nil
}

func FuzzPMIEscape(f *testing.F) {
	// Open MPI 4.1's flux keys and a part of a blob (base64 with its
	// '-' padding), from an e2e run's trace; the bytes the escapes are
	// for.
	f.Add("123-0-key0", "cG1peC5jcHVzZXQAMDMAMDAwNAAwLTEAcG1peC5obmFtZQAwMwAwMDAzAHZtAGJ0bC50Y3AuNC4x/QAAAAAAAA--")
	f.Add("2147483647-65535-key99", "a b  c\td\ne")
	f.Add("k", "100% _%20_")
	f.Add("under_score", "\xc2\x85\xc2\xa0\xff\x80\x01")
	f.Add("UPPER Case=key", "value=with=equals cmd=put")
	f.Add("", "empty key")
	f.Add("empty", "")
	f.Add("PMI_process_mapping", "(vector,(0,1,1))")
	f.Add(strings.Repeat("-", 22), "key escaped to 66 bytes")
	f.Add("long", strings.Repeat("%", 225))
	f.Add("long2", strings.Repeat("x", pmiValueUsable))
	f.Add("long3", strings.Repeat("x", pmiValueUsable+1))
	driver := buildLibPMI(f, f.TempDir())
	d := startPMIDriver(f, driver)
	if d.announced < 512 || d.announced > pmiValueUsable || d.announced%8 != 0 {
		f.Fatalf("the library announces vallen_max %d: want a multiple of 8 in [512, %d]", d.announced, pmiValueUsable)
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		key, value = strings.ReplaceAll(key, "\x00", ""), strings.ReplaceAll(value, "\x00", "")
		rc, got, err := d.roundTrip(key, value)
		if err != nil {
			t.Fatalf("put %q=%q: %v", key, value, err)
		}
		var want int32
		switch {
		case key == "", key == "PMI_process_mapping": // the server's own key
			want = pmiErrInvalidKey
		case escapedKeyLen(key) > pmiKeyMax:
			want = pmiErrInvalidKeyLen
		case escapedValueLen(value) > pmiValueUsable:
			want = pmiErrInvalidValLen
		}
		if rc[0] != want {
			t.Fatalf("put %q (escaped %d bytes) = %q (escaped %d bytes): rc %d, want %d", key, escapedKeyLen(key), value, escapedValueLen(value), rc[0], want)
		}
		if want != pmiSuccess {
			return
		}
		if rc[1] != pmiSuccess || rc[2] != pmiSuccess {
			t.Fatalf("put %q=%q: barrier rc %d, get rc %d", key, value, rc[1], rc[2])
		}
		if got != value {
			t.Fatalf("put %q=%q, got %q", key, value, got)
		}
	})
}

// TestPMIPrefetch: the library fetches the keys after a "key<N>" it is
// asked for in the same round trip (Open MPI's chunks) and keeps the
// answers until the next put or barrier: a key not found then, put
// later, is found.
func TestPMIPrefetch(t *testing.T) {
	d := startPMIDriver(t, buildLibPMI(t, t.TempDir()))
	for _, kv := range [][2]string{
		{"7-1-key0", "first chunk"}, // prefetches 7-1-key1 to key15: none there yet
		{"7-1-key1", "second chunk"},
		{"7-1-key2", "third"},
		{"7-1-key0", "first again"}, // key1 and key2 now found by the prefetch
		{"7-1-key2", "third changed"},
	} {
		rc, got, err := d.roundTrip(kv[0], kv[1])
		if err != nil || rc != [3]int32{} || got != kv[1] {
			t.Fatalf("put %s=%q, barrier, get: rc %v, got %q, err %v", kv[0], kv[1], rc, got, err)
		}
	}
}

// TestPMINothingPublished: before anything is published (a rank before
// its first barrier), a get of a key the rank has not put is "not found"
// without asking the server (Open MPI asks for every peer's data then);
// once the rank puts, or after a barrier, gets ask again.
func TestPMINothingPublished(t *testing.T) {
	d := startPMIDriver(t, buildLibPMI(t, t.TempDir()))
	step := func(what, key string, value *string, barrier bool, wantRC [3]int32, want string, wantGets int) {
		t.Helper()
		before := d.gets.count()
		rc, got, err := d.request(key, value, barrier)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if rc != wantRC || got != want {
			t.Errorf("%s: rc %v, got %q; want rc %v, %q", what, rc, got, wantRC, want)
		}
		if n := d.gets.count() - before; n != wantGets {
			t.Errorf("%s: %d get requests reached the server, want %d", what, n, wantGets)
		}
	}
	v1, v2 := "first", "second"
	notFound := [3]int32{0, 0, pmiErrInvalidKey}
	step("a peer's chunk, nothing published", "9-1-key0", nil, false, notFound, "", 0)
	step("another, nothing published", "9-2-key3", nil, false, notFound, "", 0)
	step("its own put, before the barrier", "9-0-key0", &v1, false, [3]int32{}, v1, 16) // key0 and its prefetch
	step("a peer's chunk after a put", "9-1-key0", nil, false, notFound, "", 16)
	step("put, barrier, get", "9-0-key1", &v2, true, [3]int32{}, v2, 16)
	step("published after the barrier", "9-0-key0", nil, false, [3]int32{}, v1, 16)
}

// TestPMIPutsGoWithTheNextRequest: a put is kept until the rank's next
// request and written with it: a put and a get of it take one round trip
// (one write of the server's answers), not two.
func TestPMIPutsGoWithTheNextRequest(t *testing.T) {
	d := startPMIDriver(t, buildLibPMI(t, t.TempDir()))
	v := "chunk"
	before := d.writes.count()
	rc, got, err := d.request("5-0-key0", &v, false)
	if err != nil || rc != [3]int32{} || got != v {
		t.Fatalf("put, get: rc %v, got %q, err %v", rc, got, err)
	}
	if n := d.writes.count() - before; n != 1 {
		t.Errorf("a put and a get took %d round trips, want 1", n)
	}
	// Still published by the barrier that follows.
	v2 := "chunk 2"
	if rc, got, err := d.roundTrip("5-0-key1", v2); err != nil || rc != [3]int32{} || got != v2 {
		t.Fatalf("put, barrier, get: rc %v, got %q, err %v", rc, got, err)
	}
	if rc, got, err := d.request("5-0-key0", nil, false); err != nil || rc != [3]int32{} || got != v {
		t.Fatalf("get after the barrier: rc %v, got %q, err %v", rc, got, err)
	}
}

// TestPMIInitOneRoundTrip: PMI_Init's four questions (init, get_maxes,
// get_my_kvsname, gorun_kvs_keys) go in one write, answered in one.
func TestPMIInitOneRoundTrip(t *testing.T) {
	d := startPMIDriver(t, buildLibPMI(t, t.TempDir()))
	if n := d.writes.count(); n != 1 {
		t.Errorf("PMI_Init took %d round trips, want 1", n)
	}
}
