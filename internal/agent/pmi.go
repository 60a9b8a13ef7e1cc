package agent

// The PMI-1 "simple" wire protocol, which MPICH's (and Intel MPI's and
// MVAPICH's) PMI client speaks to its launcher, as Hydra and Slurm serve
// it: every rank gets one end of a socket pair as file descriptor 3
// (PMI_FD, with PMI_RANK and PMI_SIZE), and sends lines of space-separated
// key=value tokens, "cmd=..." first, each answered with one line.
//
// The key-value space is the job's, per epoch: a rank's puts are kept by
// its agent and published at the next barrier, which is a gorun fence
// (aggregated per host, then at the launcher: one message per host, not
// per rank), so that after barrier_out a get on any host sees every put
// made before the barrier on any host.
//
// One command is gorun's own, sent only by libgorun-pmi.so (libpmi/):
// "cmd=gorun_kvs_keys" is answered "cmd=gorun_kvs_keys_result rc=0
// keys=N", the number of keys the barriers have published to this rank's
// view (PMI_process_mapping aside). With none (a rank before its first
// barrier), a get of a key the rank has not put is "not found" without
// asking: Open MPI asks for every peer's data before it puts its own. A
// client that never sends it (MPICH's) sees no difference.
//
// Every line is untrusted: its length, its tokens, keys and values are
// bounded, an unknown command is answered with rc=-1, and a malformed line
// ends that rank's PMI connection (its MPI_Init then fails) without
// touching the agent or the job.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// PMI limits, announced to the ranks by get_maxes (Hydra's values).
const (
	pmiKVSNameMax = 256
	pmiKeyMax     = 64
	pmiValueMax   = 1024
	// pmiValueUsable is the longest value MPICH's client can take in a
	// get_result: it sizes its buffer as vallen_max - kvsname_max -
	// keylen_max - 30 (MPICH 4.0.2 crashes on a longer one).
	pmiValueUsable = pmiValueMax - pmiKVSNameMax - pmiKeyMax - 30 - 1
	pmiLineMax     = 4 * (pmiKeyMax + pmiValueMax) // longer lines are refused
	pmiMaxTokens   = 16
	pmiAbortMsgMax = 512
)

// errPMILine is wrapped by every error about a malformed line.
var errPMILine = errors.New("malformed PMI line")

// parsePMILine parses one line (without its newline) into its tokens.
func parsePMILine(line []byte) (map[string]string, error) {
	if len(line) > pmiLineMax {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errPMILine, len(line), pmiLineMax)
	}
	// An abort's message is the rest of the line, spaces included (MPICH
	// 4.1 and later send message=..., Flux error_msg=...).
	var msg []byte
	for _, k := range [][]byte{[]byte(" message="), []byte(" error_msg=")} {
		if i := bytes.Index(line, k); i >= 0 && bytes.HasPrefix(bytes.TrimSpace(line), []byte("cmd=abort")) {
			line, msg = line[:i], bytes.TrimSpace(line[i+len(k):])
			break
		}
	}
	kv := map[string]string{}
	if msg != nil {
		if len(msg) > pmiAbortMsgMax {
			msg = msg[:pmiAbortMsgMax]
		}
		kv["message"] = string(msg)
	}
	for tok := range bytes.FieldsSeq(line) {
		k, v, ok := bytes.Cut(tok, []byte{'='})
		if !ok || len(k) == 0 || len(k) > 32 {
			return nil, fmt.Errorf("%w: token %q is not key=value", errPMILine, truncateBytes(tok))
		}
		for _, c := range k {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return nil, fmt.Errorf("%w: bad key %q", errPMILine, truncateBytes(k))
			}
		}
		if _, dup := kv[string(k)]; dup {
			return nil, fmt.Errorf("%w: key %q twice", errPMILine, k)
		}
		if len(kv) == pmiMaxTokens {
			return nil, fmt.Errorf("%w: more than %d tokens", errPMILine, pmiMaxTokens)
		}
		kv[string(k)] = string(v)
	}
	if kv["cmd"] == "" && kv["mcmd"] == "" {
		return nil, fmt.Errorf("%w: no cmd", errPMILine)
	}
	return kv, nil
}

func truncateBytes(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// pmiKVS is a host's view of the job's key-value space in one epoch: what
// the barriers published.
type pmiKVS struct {
	mu     sync.Mutex
	epoch  uint64
	kv     map[string]string
	merged int // the newest fence merged
	// mapping is PMI_process_mapping (which ranks share a node), from the
	// epoch table.
	mapping string
}

func (k *pmiKVS) setEpoch(t *wire.EpochTable) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.epoch, k.kv, k.mapping, k.merged = t.Epoch, map[string]string{}, processMapping(t), -1
}

func (k *pmiKVS) get(key string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if key == "PMI_process_mapping" && k.mapping != "" {
		return k.mapping, true
	}
	v, ok := k.kv[key]
	return v, ok
}

// published returns the number of keys the barriers published.
func (k *pmiKVS) published() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.kv)
}

// merge adds fence seq's keys. Every local rank of the fence brings the
// same result: it is copied once.
func (k *pmiKVS) merge(epoch uint64, seq int, kv map[string]string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if epoch == k.epoch && seq > k.merged {
		maps.Copy(k.kv, kv)
		k.merged = seq
	}
}

// processMapping is MPICH's PMI_process_mapping of t: "(vector,(n,c,k),…)",
// each block saying that c consecutive nodes from node n run k
// consecutive ranks each, in rank order.
//
// The nodes are numbered 0, 1, … in the order of their first rank, as
// Hydra numbers them, not by their index in t: the table keeps every host
// of the job, the lost ones and the idle spares without ranks. MPICH
// takes the highest node number plus one for the number of nodes, and
// when that equals the number of ranks it believes every rank alone on
// its node and skips the PMI barrier of its node-local broadcasts
// (MPIR_pmi_bcast): with sparse numbers (2 and 3 for two spares that
// replaced hosts 0 and 1 of a job of 4 ranks, 2 per host), the ranks
// sharing a node then read the shared memory segment's name before the
// first of them published it, and MPI_Init fails in MPIDU_Init_shm_init
// ("unable to allocate shared memory").
func processMapping(t *wire.EpochTable) string {
	node := make([]int, t.World)
	for h, places := range t.Placements() {
		for _, pl := range places {
			node[pl.Rank] = h
		}
	}
	denseNodes(node)
	type run struct{ node, n int }
	var runs []run
	for _, h := range node {
		if k := len(runs) - 1; k >= 0 && runs[k].node == h {
			runs[k].n++
		} else {
			runs = append(runs, run{h, 1})
		}
	}
	var b strings.Builder
	b.WriteString("(vector")
	for i := 0; i < len(runs); {
		j := i + 1
		for j < len(runs) && runs[j].node == runs[j-1].node+1 && runs[j].n == runs[i].n {
			j++
		}
		fmt.Fprintf(&b, ",(%d,%d,%d)", runs[i].node, j-i, runs[i].n)
		i = j
	}
	b.WriteString(")")
	if b.Len() > pmiValueUsable {
		return "" // MPICH then finds the nodes from the ranks' host names
	}
	return b.String()
}

// denseNodes renumbers the nodes of node (a node per rank) 0, 1, … in
// the order of their first rank.
func denseNodes(node []int) {
	id := map[int]int{}
	for r, h := range node {
		n, ok := id[h]
		if !ok {
			n = len(id)
			id[h] = n
		}
		node[r] = n
	}
}

// pmiConn serves one rank's PMI connection.
type pmiConn struct {
	s       *rankSockets
	kvs     *pmiKVS
	rank    int
	gen     uint64 // the rank's restart generation
	size    int
	kvsname string
	rw      io.ReadWriter
	// w buffers the replies to rw while serve runs: they are written
	// when no whole request is left to read (see serve), so that the
	// answers to requests a client sent together (libgorun-pmi.so's
	// prefetching gets) go in one write and wake the rank once. It is
	// made at serve's first reply: a rank that never speaks PMI (most
	// programs a launch of many starts) costs no reply buffer.
	w       *bufio.Writer
	serving bool              // serve runs: replies go through w
	pending map[string]string // puts since the last barrier
	// aborted is called when the rank says abort, with its exit code and
	// message; the connection is left open (the rank waits on it to be
	// killed). failed is called when the rank cannot go on (its barrier
	// failed): the agent kills it. session is told 1 at init, 2 at
	// finalize.
	aborted func(code int, msg string)
	failed  func(msg string)
	session func(state int32)
}

// serve answers the rank's lines until it closes its end, finalizes, or
// sends a malformed line. Replies are buffered until no whole request is
// left to read, or a command may wait (a barrier, an abort).
func (p *pmiConn) serve() error {
	r := bufio.NewReaderSize(p.rw, pmiLineMax+1)
	p.serving = true
	defer func() {
		// The answers to the lines before a malformed one still go
		// (nothing is left otherwise).
		_ = p.flush()
		p.w, p.serving = nil, false
	}()
	for {
		if !wholeLineBuffered(r) {
			// The next read may wait for the rank, which may wait for
			// these replies.
			if err := p.flush(); err != nil {
				return err
			}
		}
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("%w: longer than %d bytes", errPMILine, pmiLineMax)
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		kv, err := parsePMILine(line[:len(line)-1])
		if err != nil {
			return err
		}
		if kv["mcmd"] != "" {
			// A multi-line command (spawn): read to its end, refuse it.
			for !bytes.HasPrefix(line, []byte("endcmd")) {
				if line, err = r.ReadSlice('\n'); err != nil {
					return fmt.Errorf("%w: unterminated %s", errPMILine, kv["mcmd"])
				}
			}
			if err := p.reply("cmd=spawn_result rc=-1 errmsg=spawn_is_not_supported_by_gorun"); err != nil {
				return err
			}
			continue
		}
		done, err := p.command(kv)
		if err != nil || done {
			return err
		}
	}
}

// pmiReplyBuffer is the size of a connection's reply buffer: the answers
// to 16 gets of the longest values.
const pmiReplyBuffer = 16 << 10

// wholeLineBuffered says whether r holds a whole line, which a read
// returns without waiting.
func wholeLineBuffered(r *bufio.Reader) bool {
	b, _ := r.Peek(r.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// reply sends line, buffered while serve runs.
func (p *pmiConn) reply(line string) error {
	if !p.serving {
		_, err := io.WriteString(p.rw, line+"\n")
		return err
	}
	if p.w == nil {
		p.w = bufio.NewWriterSize(p.rw, pmiReplyBuffer)
	}
	if _, err := p.w.WriteString(line); err != nil {
		return err
	}
	return p.w.WriteByte('\n')
}

// flush writes the replies buffered.
func (p *pmiConn) flush() error {
	if p.w == nil {
		return nil
	}
	return p.w.Flush()
}

// command answers one command; done says the rank finalized or aborted.
func (p *pmiConn) command(kv map[string]string) (done bool, err error) {
	cmd := kv["cmd"]
	switch cmd {
	case "init":
		if kv["pmi_version"] != "1" {
			return false, p.reply("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1 msg=gorun_serves_pmi_version_1")
		}
		p.session(1)
		return false, p.reply("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0")
	case "get_maxes":
		return false, p.reply(fmt.Sprintf("cmd=maxes rc=0 kvsname_max=%d keylen_max=%d vallen_max=%d", pmiKVSNameMax, pmiKeyMax, pmiValueMax))
	case "get_appnum":
		return false, p.reply("cmd=appnum rc=0 appnum=0")
	case "get_my_kvsname":
		return false, p.reply("cmd=my_kvsname rc=0 kvsname=" + p.kvsname)
	case "get_universe_size":
		return false, p.reply("cmd=universe_size rc=0 size=" + strconv.Itoa(p.size))
	case "put":
		key, val := kv["key"], kv["value"]
		switch {
		case kv["kvsname"] != p.kvsname:
			return false, p.reply("cmd=put_result rc=-1 msg=unknown_kvsname")
		case key == "" || len(key) > pmiKeyMax || len(val) > pmiValueUsable:
			return false, p.reply("cmd=put_result rc=-1 msg=key_or_value_too_long")
		case len(p.pending) >= wire.MaxFenceKeys:
			return false, p.reply("cmd=put_result rc=-1 msg=too_many_puts_before_a_barrier")
		}
		p.pending[key] = val
		return false, p.reply("cmd=put_result rc=0 msg=success")
	case "get":
		if kv["kvsname"] != p.kvsname {
			return false, p.reply("cmd=get_result rc=-1 msg=unknown_kvsname")
		}
		v, ok := p.pending[kv["key"]]
		if !ok {
			v, ok = p.kvs.get(kv["key"])
		}
		if !ok {
			return false, p.reply("cmd=get_result rc=-1 msg=key_not_found")
		}
		return false, p.reply("cmd=get_result rc=0 msg=success value=" + v)
	case "barrier_in":
		// MPICH goes on after a barrier_out whatever its rc: a failed
		// barrier must end the rank (and so the job), not just say so.
		if err := p.flush(); err != nil {
			return false, err
		}
		res, err := p.s.fenceNext(p.gen, p.rank, p.pending)
		if err == nil && res.Err != "" {
			err = errors.New(res.Err)
		}
		if err != nil {
			p.failed("its PMI barrier failed: " + err.Error())
			_ = p.reply("cmd=barrier_out rc=-1 msg=" + pmiWord(err.Error()))
			_ = p.flush()
			_, _ = io.Copy(io.Discard, p.rw)
			return true, nil
		}
		p.kvs.merge(res.Epoch, res.Seq, res.KV)
		p.pending = map[string]string{}
		return false, p.reply("cmd=barrier_out rc=0")
	case "finalize":
		// The connection stays open: MPICH 4.1 and later may initialize
		// again over it.
		p.session(2)
		return false, p.reply("cmd=finalize_ack rc=0")
	case "abort":
		code, err := strconv.Atoi(kv["exitcode"])
		if err != nil || code < 0 || code > 255 {
			code = 1
		}
		_ = p.flush() // the answers before it, which the rank may wait for
		p.aborted(code, kv["message"])
		_, _ = io.Copy(io.Discard, p.rw) // until the rank is gone
		return true, nil
	case "gorun_kvs_keys":
		return false, p.reply("cmd=gorun_kvs_keys_result rc=0 keys=" + strconv.Itoa(p.kvs.published()))
	case "publish_name", "unpublish_name", "lookup_name":
		return false, p.reply("cmd=" + strings.TrimSuffix(cmd, "_name") + "_result rc=-1 msg=name_service_not_supported_by_gorun")
	}
	return false, p.reply("cmd=" + pmiWord(cmd) + "_result rc=-1 msg=unknown_command")
}

// pmiWord makes s one token of a PMI line.
func pmiWord(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == ' ' || r == '\n' || r == '=' || r < 0x20 {
			return '_'
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// fenceNext enters rank, of restart generation gen, into its next fence
// with kv.
func (s *rankSockets) fenceNext(gen uint64, rank int, kv map[string]string) (*wire.Fence, error) {
	s.mu.Lock()
	f := &wire.Fence{Epoch: s.epoch, Seq: s.nextSeq[rank], KV: kv}
	s.mu.Unlock()
	return s.fence(gen, rank, f)
}

// pmiSocketPair returns the agent's end and the rank's end of a rank's
// PMI connection.
func pmiSocketPair() (mine, theirs *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("PMI socket: %w", err)
	}
	// The agent's end is non-blocking, so that Go's poller serves it and
	// closing it ends a read in progress; the rank's stays blocking, as
	// PMI clients expect.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("PMI socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "pmi"), os.NewFile(uintptr(fds[1]), "pmi-rank"), nil
}

// servePMI serves rank p's PMI connection on f until the rank closes it
// (or the agent does, at its end).
func (a *agent) servePMI(p *rankProc, f *os.File, world int) {
	defer a.pmiWG.Done()
	defer f.Close()
	c := &pmiConn{
		s: a.socks, kvs: &a.pmiKVS, rank: p.place.Rank, gen: p.gen, size: world, kvsname: "gorun-" + a.cfg.Job,
		rw: f, pending: map[string]string{},
		aborted: func(code int, msg string) {
			p.setPMIMsg(msg)
			p.abort.Store(int32(code) + 1)
			a.abortNotice(p, code, msg)
			p.signal(syscall.SIGKILL) // the rank waits for the job's end, as under Hydra
		},
		failed:  p.failWith,
		session: func(state int32) { p.pmiState.CompareAndSwap(state-1, state) },
	}
	if err := c.serve(); err != nil {
		a.log.Warn("PMI connection of a rank ended", "rank", p.place.Rank, "err", err)
	}
}

// abortFlushTimeout bounds abortNotice's wait for the control-plane
// server: the rank is killed then all the same.
const abortFlushTimeout = time.Second

// abortNotice tells the launcher that rank p called MPI_Abort with code
// (and msg), before the agent kills it, and waits (at most
// abortFlushTimeout) until the control-plane server has it.
//
// The rank's own exit is reported only once it is reaped and its output
// drained, while its peers fail as soon as it dies (their connections to
// it break) and their agents report that at once: without this notice
// their exit code could reach the launcher first, and the failure window
// close before the rank's exit came (the job would end with 1, not the
// abort's code); told of the abort first, the launcher's decision waits
// for the rank's exit (hotswap, abort.go). The flush is what orders them: the
// server answers the flush's PING only after it has handled every
// message sent on this connection before it, handing the notice to the
// launcher's subscription then; a peer's failure follows the kill, which
// follows the flush, so it reaches the server, and the launcher (one
// subscription, in the order the server handed messages to it), after.
func (a *agent) abortNotice(p *rankProc, code int, msg string) {
	a.event(&wire.Event{Kind: wire.EventAbort, Host: a.cfg.Host, Rank: p.place.Rank, Pid: p.pid, Gen: p.gen,
		Code: code, Msg: abortWhy(code, msg)})
	if err := a.ctl.FlushTimeout(abortFlushTimeout); err != nil {
		a.log.Warn("cannot flush the report of a rank's MPI_Abort", "rank", p.place.Rank, "err", err)
	}
}

// abortWhy is what the launcher says of a rank that called MPI_Abort with
// code, and msg (its PMI abort's message, or ""): users match on it.
func abortWhy(code int, msg string) string {
	if msg != "" {
		msg = ": " + msg
	}
	return fmt.Sprintf("called MPI_Abort with exit code %d%s", code, msg)
}
