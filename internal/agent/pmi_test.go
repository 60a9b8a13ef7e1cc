package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

func TestParsePMILine(t *testing.T) {
	tests := []struct {
		line string
		want map[string]string // nil: refused
	}{
		{"cmd=init pmi_version=1 pmi_subversion=1", map[string]string{"cmd": "init", "pmi_version": "1", "pmi_subversion": "1"}},
		{"cmd=put kvsname=k key=hostname[0] value=vm", map[string]string{"cmd": "put", "kvsname": "k", "key": "hostname[0]", "value": "vm"}},
		{"cmd=get_result rc=0 value=", map[string]string{"cmd": "get_result", "rc": "0", "value": ""}},
		{"  cmd=barrier_in  ", map[string]string{"cmd": "barrier_in"}},
		{"mcmd=spawn", map[string]string{"mcmd": "spawn"}},
		{"cmd=abort exitcode=7 message=application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1", map[string]string{"cmd": "abort", "exitcode": "7", "message": "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1"}},
		{"cmd=abort exitcode=3 error_msg=it failed", map[string]string{"cmd": "abort", "exitcode": "3", "message": "it failed"}},
		{"cmd=put key=a value=b message=c d", nil},
		{"", nil},
		{"cmd=", nil},
		{"init", nil},
		{"=x cmd=init", nil},
		{"cmd=init cmd=init", nil},
		{"CMD=init", nil},
		{"cmd=init key-x=1", nil},
		{"cmd=init " + strings.Repeat("a=1 ", 20), nil},
		{"cmd=put value=" + strings.Repeat("x", pmiLineMax), nil},
	}
	for _, tt := range tests {
		got, err := parsePMILine([]byte(tt.line))
		if tt.want == nil {
			if err == nil || !errors.Is(err, errPMILine) {
				t.Errorf("%.60q: accepted (%v)", tt.line, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.line, err)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("%q: %v, want %v", tt.line, got, tt.want)
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%q: %s=%q, want %q", tt.line, k, got[k], v)
			}
		}
	}
}

func TestProcessMapping(t *testing.T) {
	table := func(perHost ...[]int) *wire.EpochTable {
		tab := &wire.EpochTable{Version: wire.Version, Job: "j", World: 0}
		for _, rs := range perHost {
			tab.World += len(rs)
			tab.Hosts = append(tab.Hosts, wire.TableHost{Name: "h", Ranks: wire.CompressRanks(rs)})
		}
		return tab
	}
	tests := []struct {
		tab  *wire.EpochTable
		want string
	}{
		{table([]int{0}), "(vector,(0,1,1))"},
		{table([]int{0, 1}, []int{2, 3}), "(vector,(0,2,2))"},         // by slot
		{table([]int{0, 2}, []int{1, 3}), "(vector,(0,2,1),(0,2,1))"}, // by node
		{table([]int{0, 1, 2}, []int{3}), "(vector,(0,1,3),(1,1,1))"},
		// Hosts without ranks (lost, or idle spares) are no nodes: the
		// nodes are numbered by their first rank. Two spares that took
		// the ranks of hosts 0 and 1 (chaos seed 2026, run 98).
		{table(nil, nil, []int{0, 1}, []int{2, 3}), "(vector,(0,2,2))"},
		{table(nil, []int{2, 3}, []int{0, 1}), "(vector,(0,2,2))"},
		{table([]int{0, 1}, nil, []int{2, 3}, nil), "(vector,(0,2,2))"},
		{table(nil, []int{1, 3}, []int{0, 2}), "(vector,(0,2,1),(0,2,1))"},
	}
	for _, tt := range tests {
		if got := processMapping(tt.tab); got != tt.want {
			t.Errorf("%v: %s, want %s", tt.tab.Hosts, got, tt.want)
		}
	}
	// 200 ranks on 80 hosts of 2 and 3 slots in turn: a mapping longer
	// than MPICH's client can take (673 bytes) is not given at all.
	var hosts [][]int
	for h, r := 0, 0; h < 80; h++ {
		n := 2 + h%2
		var rs []int
		for range n {
			rs = append(rs, r)
			r++
		}
		hosts = append(hosts, rs)
	}
	if got := processMapping(table(hosts...)); got != "" {
		t.Errorf("a mapping of %d bytes was given (MPICH takes at most %d)", len(got), pmiValueUsable)
	}
}

// TestProcessMappingMPICH reads the mapping of tables with hosts without
// ranks (lost hosts, idle spares, between or before the others) as MPICH
// does, and checks that it sees the table: two ranks share a node just
// when they share a host, and there are as many nodes as hosts with
// ranks. MPICH counts the highest node number plus one; with more, when
// that count equals the number of ranks, the ranks sharing a host skip
// the PMI barrier of their node-local broadcast and MPI_Init fails (chaos
// seed 2026, run 98: "(vector,(2,2,2))" for hosts 2 and 3 of four).
func TestProcessMappingMPICH(t *testing.T) {
	for hosts := 1; hosts <= 5; hosts++ {
		for empty := 0; empty < 1<<hosts-1; empty++ { // a bit per host without ranks; one host at least runs ranks
			for _, perHost := range []int{1, 2, 3} {
				for _, byNode := range []bool{false, true} {
					tab := mappingTable(hosts, empty, perHost, byNode)
					name := fmt.Sprintf("hosts %d empty %b, %d per host, by node %v", hosts, empty, perHost, byNode)
					checkMPICHMapping(t, name, tab)
				}
			}
		}
	}
}

// mappingTable returns a table of hosts hosts, those of the bits of empty
// without ranks, the others with perHost ranks each, by slot or by node.
func mappingTable(hosts, empty, perHost int, byNode bool) *wire.EpochTable {
	var used []int
	for h := range hosts {
		if empty&(1<<h) == 0 {
			used = append(used, h)
		}
	}
	ranks := make([][]int, hosts)
	world := perHost * len(used)
	for r := range world {
		i := r / perHost
		if byNode {
			i = r % len(used)
		}
		ranks[used[i]] = append(ranks[used[i]], r)
	}
	tab := &wire.EpochTable{Version: wire.Version, Job: "j", World: world}
	for h := range hosts {
		tab.Hosts = append(tab.Hosts, wire.TableHost{Name: fmt.Sprint("h", h), Ranks: wire.CompressRanks(ranks[h]), Spare: ranks[h] == nil})
	}
	return tab
}

// checkMPICHMapping checks what MPICH reads from tab's mapping.
func checkMPICHMapping(t *testing.T, name string, tab *wire.EpochTable) {
	t.Helper()
	m := processMapping(tab)
	node, nodes, err := mpichNodes(m, tab.World)
	if err != nil {
		t.Fatalf("%s: %q: %v", name, m, err)
	}
	if want := tab.NodeCount(); nodes != want {
		t.Errorf("%s: %q: MPICH counts %d nodes, the table has %d", name, m, nodes, want)
	}
	host := make([]int, tab.World)
	for h, places := range tab.Placements() {
		for _, pl := range places {
			host[pl.Rank] = h
		}
	}
	for r := range tab.World {
		for q := range r {
			if (node[r] == node[q]) != (host[r] == host[q]) {
				t.Errorf("%s: %q: ranks %d and %d on nodes %d and %d, hosts %d and %d", name, m, q, r, node[q], node[r], host[q], host[r])
			}
		}
	}
}

// mpichNodes reads mapping as MPICH 4.0.2 does
// (MPIR_NODEMAP_populate_ids_from_mapping, src/util/mpir_nodemap.h): the
// node of each of world ranks, and the number of nodes, the highest node
// plus one. Blocks that cover fewer ranks than world wrap around from the
// first one starting at node 0.
func mpichNodes(mapping string, world int) (node []int, nodes int, err error) {
	body, ok := strings.CutPrefix(mapping, "(vector,")
	if !ok || !strings.HasSuffix(body, ")") {
		return nil, 0, fmt.Errorf("not a vector mapping")
	}
	type block struct{ start, count, size int }
	var blocks []block
	for _, f := range strings.Split(strings.TrimSuffix(body, ")"), "),") {
		var b block
		if _, err := fmt.Sscanf(strings.TrimSuffix(f, ")"), "(%d,%d,%d", &b.start, &b.count, &b.size); err != nil {
			return nil, 0, fmt.Errorf("block %q: %w", f, err)
		}
		blocks = append(blocks, b)
	}
	node = make([]int, world)
	wrap := false
	for r := 0; r < world; {
		before, b := r, 0
		for wrap && b < len(blocks) && blocks[b].start != 0 {
			b++
		}
		for ; b < len(blocks) && r < world; b++ {
			if blocks[b].start == 0 {
				wrap = true
			}
			for c := 0; c < blocks[b].count && r < world; c++ {
				for k := 0; k < blocks[b].size && r < world; k++ {
					node[r] = blocks[b].start + c
					r++
				}
			}
		}
		if r == before {
			return nil, 0, fmt.Errorf("the blocks cover no rank")
		}
	}
	return node, slices.Max(node) + 1, nil
}

// pmiPeer runs a pmiConn on one end of a pipe and returns the rank's end.
func pmiPeer(t testing.TB) (net.Conn, *bufio.Reader, chan error, *int) {
	mine, theirs := net.Pipe()
	aborted := new(int)
	*aborted = -1
	kvs := &pmiKVS{kv: map[string]string{"published": "yes"}}
	c := &pmiConn{kvs: kvs, rank: 2, size: 4, kvsname: "gorun-j", rw: mine, pending: map[string]string{},
		aborted: func(code int, _ string) { *aborted = code; mine.Close() },
		failed:  func(string) { mine.Close() },
		session: func(int32) {}}
	done := make(chan error, 1)
	go func() { done <- c.serve(); mine.Close() }()
	t.Cleanup(func() { theirs.Close() })
	return theirs, bufio.NewReader(theirs), done, aborted
}

func TestPMICommands(t *testing.T) {
	conn, r, done, aborted := pmiPeer(t)
	ask := func(line, want string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, line+"\n"); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if got != want+"\n" {
			t.Errorf("%s: got %q, want %q", line, got, want)
		}
	}
	ask("cmd=init pmi_version=1 pmi_subversion=1", "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0")
	ask("cmd=init pmi_version=2 pmi_subversion=0", "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1 msg=gorun_serves_pmi_version_1")
	ask("cmd=get_maxes", "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024")
	ask("cmd=get_appnum", "cmd=appnum rc=0 appnum=0")
	ask("cmd=get_my_kvsname", "cmd=my_kvsname rc=0 kvsname=gorun-j")
	ask("cmd=get_universe_size", "cmd=universe_size rc=0 size=4")
	ask("cmd=put kvsname=gorun-j key=a value=1", "cmd=put_result rc=0 msg=success")
	ask("cmd=put kvsname=other key=a value=1", "cmd=put_result rc=-1 msg=unknown_kvsname")
	ask("cmd=put kvsname=gorun-j key="+strings.Repeat("k", 65)+" value=1", "cmd=put_result rc=-1 msg=key_or_value_too_long")
	ask("cmd=get kvsname=gorun-j key=a", "cmd=get_result rc=0 msg=success value=1") // its own put
	ask("cmd=get kvsname=gorun-j key=published", "cmd=get_result rc=0 msg=success value=yes")
	ask("cmd=get kvsname=gorun-j key=nothing", "cmd=get_result rc=-1 msg=key_not_found")
	ask("cmd=gorun_kvs_keys", "cmd=gorun_kvs_keys_result rc=0 keys=1") // "published"
	ask("cmd=lookup_name service=x", "cmd=lookup_result rc=-1 msg=name_service_not_supported_by_gorun")
	ask("cmd=finalize", "cmd=finalize_ack rc=0")
	ask("cmd=get_appnum", "cmd=appnum rc=0 appnum=0") // still served after finalize
	ask("cmd=frobnicate", "cmd=frobnicate_result rc=-1 msg=unknown_command")
	io.WriteString(conn, "mcmd=spawn\nnprocs=2\nexecname=x\nendcmd\n")
	if got, _ := r.ReadString('\n'); !strings.Contains(got, "cmd=spawn_result rc=-1") {
		t.Errorf("spawn: %q", got)
	}
	// Abort has no answer: the agent kills the rank.
	io.WriteString(conn, "cmd=abort exitcode=7\n")
	if err := <-done; err != nil {
		t.Fatalf("serve after abort: %v", err)
	}
	if *aborted != 7 {
		t.Fatalf("abort code %d, want 7", *aborted)
	}
}

func TestPMIRefusesMalformed(t *testing.T) {
	for _, line := range []string{"garbage", "cmd=put value=" + strings.Repeat("v", pmiLineMax+10), "cmd=a cmd=b"} {
		conn, _, done, _ := pmiPeer(t)
		go io.WriteString(conn, line+"\n")
		select {
		case err := <-done:
			if !errors.Is(err, errPMILine) {
				t.Errorf("%.40q: serve ended with %v, want a malformed-line error", line, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%.40q: still served", line)
		}
	}
}

func FuzzParsePMILine(f *testing.F) {
	for _, s := range []string{"cmd=init pmi_version=1 pmi_subversion=1", "cmd=put kvsname=k key=a value=b", "mcmd=spawn", "cmd=", "a=b=c cmd=x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		kv, err := parsePMILine(line)
		if err != nil {
			return
		}
		if len(kv) > pmiMaxTokens || kv["cmd"] == "" && kv["mcmd"] == "" {
			t.Fatalf("accepted %q as %v", line, kv)
		}
		for k := range kv {
			if k == "" || len(k) > 32 {
				t.Fatalf("accepted key %q", k)
			}
		}
	})
}

// FuzzPMIConn: whatever a rank sends, the server neither panics nor
// hangs; it answers or ends the connection.
func FuzzPMIConn(f *testing.F) {
	f.Add([]byte("cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_maxes\ncmd=put kvsname=gorun-j key=a value=b\ncmd=get kvsname=gorun-j key=a\ncmd=finalize\n"))
	f.Add([]byte("mcmd=spawn\nendcmd\n"))
	f.Add([]byte("cmd=abort exitcode=300\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		if strings.Contains(string(in), "barrier_in") {
			return // a fence needs an agent; tested end to end
		}
		conn, r, done, _ := pmiPeer(t)
		go func() {
			conn.Write(in)
			conn.Close()
		}()
		go io.Copy(io.Discard, r)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("the server hung on %q", in)
		}
	})
}

// countingWriter records each write it is given, and passes it on to w
// if set.
type countingWriter struct {
	w      io.Writer
	mu     sync.Mutex
	writes []string
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, string(b))
	w.mu.Unlock()
	if w.w == nil {
		return len(b), nil
	}
	return w.w.Write(b)
}

// count returns the number of writes so far.
func (w *countingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.writes)
}

// TestPMIRepliesBatched: the answers to requests a rank sent together
// (libgorun-pmi.so's prefetching gets, 16 in one write) go back in one
// write, which wakes the rank once, not once per answer; requests that
// come one at a time are answered one at a time.
func TestPMIRepliesBatched(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reads  []string // what each read of the rank's end returns
		writes int      // writes of the replies
	}{
		{"16 gets at once", []string{strings.Repeat("cmd=get kvsname=gorun-j key=published\n", 8) + strings.Repeat("cmd=get kvsname=gorun-j key=nothing\n", 8)}, 1},
		{"one at a time", []string{"cmd=get kvsname=gorun-j key=published\n", "cmd=get kvsname=gorun-j key=nothing\n"}, 2},
		{"a line in two reads", []string{"cmd=get_appnum\ncmd=get kvsname=gorun-j ", "key=published\n"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &countingWriter{}
			rw := struct {
				io.Reader
				io.Writer
			}{&chunkReader{chunks: slices.Clone(tc.reads)}, w}
			c := &pmiConn{kvs: &pmiKVS{kv: map[string]string{"published": "yes"}}, size: 4, kvsname: "gorun-j", rw: rw, pending: map[string]string{}}
			if err := c.serve(); err != nil {
				t.Fatal(err)
			}
			if len(w.writes) != tc.writes {
				t.Errorf("%d writes, want %d: %q", len(w.writes), tc.writes, w.writes)
			}
			var want strings.Builder
			for line := range strings.Lines(strings.Join(tc.reads, "")) {
				switch {
				case strings.Contains(line, "key=published"):
					want.WriteString("cmd=get_result rc=0 msg=success value=yes\n")
				case strings.Contains(line, "key=nothing"):
					want.WriteString("cmd=get_result rc=-1 msg=key_not_found\n")
				default:
					want.WriteString("cmd=appnum rc=0 appnum=0\n")
				}
			}
			if got := strings.Join(w.writes, ""); got != want.String() {
				t.Errorf("replies %q, want %q", got, want.String())
			}
		})
	}
}

// chunkReader returns one chunk per read, then io.EOF.
type chunkReader struct{ chunks []string }

func (r *chunkReader) Read(b []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(b, r.chunks[0])
	if r.chunks[0] = r.chunks[0][n:]; r.chunks[0] == "" {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

// TestPMISilentRankNoReplyBuffer: serving a rank that closes its PMI
// connection without a word (a program that is not an MPI one) costs no
// reply buffer: at a launch of many ranks, those were most of what the
// launcher allocated.
func TestPMISilentRankNoReplyBuffer(t *testing.T) {
	mine, theirs := net.Pipe()
	theirs.Close()
	c := &pmiConn{kvs: &pmiKVS{kv: map[string]string{}}, size: 1, kvsname: "gorun-j", rw: mine, pending: map[string]string{},
		aborted: func(int, string) {}, failed: func(string) {}, session: func(int32) {}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := c.serve()
	runtime.ReadMemStats(&after)
	mine.Close()
	if err != nil {
		t.Fatalf("serve: %v", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got >= pmiReplyBuffer {
		t.Errorf("serving a silent rank allocated %d bytes, want less than the reply buffer's %d", got, pmiReplyBuffer)
	}
}
