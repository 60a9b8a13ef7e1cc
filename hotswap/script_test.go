package hotswap

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the actual output")

// TestScripts runs every testdata/*.txt script: blocks of a command line,
// "----", and the expected output up to a blank line, as etcd raft's
// datadriven tests. Lines starting with # are comments.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type block struct {
	pre      []string // comments and blank lines before the command
	cmd      string
	line     int
	expected string
}

func parseScript(t *testing.T, text string) (blocks []block, tail []string) {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		b := block{pre: pre, cmd: l, line: i + 1}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("line %d: %q not followed by ----", i+1, l)
		}
		i += 2
		var out []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		b.expected = strings.Join(out, "\n")
		blocks = append(blocks, b)
		if i < len(lines) {
			pre = append(pre, "")
		}
	}
	return blocks, pre
}

func runScript(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blocks, tail := parseScript(t, string(data))
	d := &driver{}
	var b strings.Builder
	for _, bl := range blocks {
		got := d.run(bl.cmd)
		for _, p := range bl.pre {
			b.WriteString(p + "\n")
		}
		b.WriteString(bl.cmd + "\n----\n" + got + "\n")
		if !*rewrite && got != bl.expected {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", file, bl.line, bl.cmd, got, bl.expected)
		}
	}
	if *rewrite {
		for _, p := range tail {
			if p != "" {
				b.WriteString(p + "\n")
			}
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// driver runs a script's commands against a Machine.
type driver struct {
	m     *Machine
	hosts []topology.Host
	now   time.Duration
}

// tokens splits a command line at spaces, except inside double quotes,
// which it removes: why="exit status 1" is one token.
func tokens(s string) []string {
	var out []string
	var b strings.Builder
	quoted := false
	for _, c := range s {
		switch {
		case c == '"':
			quoted = !quoted
		case c == ' ' && !quoted:
			if b.Len() > 0 {
				out = append(out, b.String())
				b.Reset()
			}
		default:
			b.WriteRune(c)
		}
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// args splits "k=v k2=v2 flag" into a map (a flag maps to "").
func args(fields []string) map[string]string {
	a := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		a[k] = v
	}
	return a
}

func (d *driver) run(cmd string) (out string) {
	defer func() {
		if r := recover(); r != nil {
			out = fmt.Sprintf("panic: %v", r)
		}
	}()
	fields := tokens(cmd)
	switch fields[0] {
	case "config":
		return d.config(args(fields[1:]))
	case "event":
		if d.m == nil {
			return "error: no config"
		}
		return d.event(fields[1], args(fields[2:]))
	case "state":
		return d.state()
	}
	return "error: unknown command " + fields[0]
}

func (d *driver) config(a map[string]string) string {
	var c Config
	d.hosts = nil
	for _, h := range strings.Split(a["hosts"], ",") {
		p := strings.Split(h, ":")
		x := topology.Host{Name: p[0], Slots: 1}
		if len(p) > 1 {
			x.Slots, _ = strconv.Atoi(p[1])
		}
		if len(p) > 2 {
			x.Rack = p[2]
		}
		d.hosts = append(d.hosts, x)
	}
	if s, ok := a["spares"]; ok {
		for _, n := range strings.Split(s, ",") {
			if i := d.hostIndex(n); i >= 0 {
				d.hosts[i].Spare = true
			}
		}
	}
	c.Hosts = d.hosts
	c.World, _ = strconv.Atoi(a["world"])
	c.TP, _ = strconv.Atoi(a["tp"])
	c.PP, _ = strconv.Atoi(a["pp"])
	c.MaxRestarts, _ = strconv.Atoi(a["max-restarts"])
	c.Oversubscribe = a["oversubscribe"] != "" || hasKey(a, "oversubscribe")
	c.Durable = hasKey(a, "durable")
	c.Diff = hasKey(a, "diff")
	if a["recovery"] == "in-place" {
		c.Recovery = RecoveryInPlace
	}
	if a["on-no-spare"] == "abort" {
		c.OnNoSpare = OnNoSpareAbort
	}
	for k, p := range map[string]*time.Duration{"fail-window": &c.FailWindow, "suspect-timeout": &c.SuspectTimeout,
		"heartbeat-timeout": &c.HeartbeatTimeout, "hang-timeout": &c.HangTimeout, "kill-grace": &c.KillGrace} {
		if v, ok := a[k]; ok {
			*p, _ = time.ParseDuration(v)
		}
	}
	if !hasKey(a, "heartbeat-timeout") {
		c.HeartbeatTimeout = time.Hour // scripts about heartbeats set it
	}
	by := topology.MapBySlot
	if a["map-by"] == "node" {
		by = topology.MapByNode
	}
	asg, err := topology.MapRanks(d.hosts, topology.MapOptions{NP: c.World, By: by, Oversubscribe: c.Oversubscribe})
	if err != nil {
		return "error: " + err.Error()
	}
	for _, x := range asg {
		c.Assign = append(c.Assign, x.Host)
	}
	if k, _ := strconv.Atoi(a["replicas"]); k > 0 {
		l, err := topology.NewLayout(c.World, max(c.TP, 1), max(c.PP, 1))
		if err != nil {
			return "error: " + err.Error()
		}
		p, err := topology.Place(l, d.hosts, asg, topology.PlacementOptions{K: k})
		if err != nil {
			return "error: " + err.Error()
		}
		c.Holders = p.Holders
	}
	if v := a["ec"]; v != "" {
		var k, mm int
		if _, err := fmt.Sscanf(v, "%d+%d", &k, &mm); err != nil {
			return "error: ec=" + v + ": " + err.Error()
		}
		groups, err := topology.PlanEC(d.hosts, asg, topology.ECOptions{K: k, M: mm, Spread: hasKey(a, "spread")})
		if err != nil {
			return "error: " + err.Error()
		}
		c.EC = groups
	}
	m, err := New(c)
	if err != nil {
		return "error: " + err.Error()
	}
	d.m, d.now = m, 0
	if a["register"] != "none" {
		for h := range d.hosts {
			m.Step(0, AgentRegistered{Host: h, Spare: d.hosts[h].Spare})
		}
	}
	return d.state()
}

func hasKey(a map[string]string, k string) bool { _, ok := a[k]; return ok }

func (d *driver) hostIndex(n string) int {
	for i, h := range d.hosts {
		if h.Name == n {
			return i
		}
	}
	return -1
}

func (d *driver) state() string {
	m := d.m
	var b strings.Builder
	fmt.Fprintf(&b, "epoch=%d gen=%d g=%d table=%s", m.epoch, m.gen, m.g, table(m.rankHost, m.names))
	if m.holders != nil {
		b.WriteString(" holders=")
		writeHolders(&b, m.holders)
	}
	if m.ec != nil {
		b.WriteString(" ec=" + ecString(m.ec.groups, m.names))
	}
	var sp []string
	for h, s := range m.spare {
		if s && m.alive[h] {
			sp = append(sp, m.names[h])
		}
	}
	if len(sp) > 0 {
		b.WriteString(" spares=" + strings.Join(sp, ","))
	}
	if m.under > 0 {
		fmt.Fprintf(&b, " under-protected=%d", m.under)
	}
	if m.rec != nil {
		b.WriteString(" recovering")
	}
	if m.stopped {
		fmt.Fprintf(&b, " stopped code=%d", m.code)
	}
	if t, ok := m.NextDeadline(); ok {
		fmt.Fprintf(&b, " next=%v", t)
	}
	return b.String()
}

func (d *driver) event(kind string, a map[string]string) string {
	if v, ok := a["at"]; ok {
		t, err := time.ParseDuration(v)
		if err != nil {
			return "error: " + err.Error()
		}
		d.now = t
	}
	m := d.m
	num := func(k string, def int) int {
		if v, ok := a[k]; ok {
			if i := d.hostIndex(v); i >= 0 {
				return i
			}
			n, _ := strconv.Atoi(v)
			return n
		}
		return def
	}
	var evs []Event
	switch kind {
	case "rank-exited":
		r := num("rank", 0)
		e := RankExited{Rank: r, Host: num("host", m.rankHost[r]), Pid: num("pid", 0), Gen: uint64(num("gen", int(m.gen))), Code: num("code", 0),
			Abort: hasKey(a, "abort"), Stopped: hasKey(a, "stopped"), Msg: a["msg"]}
		if s, ok := a["signal"]; ok {
			e.Signal = sig(s)
		}
		evs = append(evs, e)
	case "agent-exited":
		evs = append(evs, AgentExited{Host: num("host", 0), Why: a["why"]})
	case "registered":
		evs = append(evs, AgentRegistered{Host: num("host", 0), Spare: hasKey(a, "spare")})
	case "heartbeat":
		if a["host"] == "all" {
			for h := range d.hosts {
				if m.alive[h] && m.registered[h] {
					evs = append(evs, Heartbeat{Host: h})
				}
			}
		} else {
			evs = append(evs, Heartbeat{Host: num("host", 0)})
		}
	case "control-dropped":
		evs = append(evs, ControlDropped{Host: num("host", 0)})
	case "replication-failed":
		evs = append(evs, ReplicationFailed{From: num("from", 0), To: num("to", 0)})
	case "peer-lost":
		var ps []int
		for _, p := range strings.Split(a["peers"], ",") {
			n, _ := strconv.Atoi(p)
			ps = append(ps, n)
		}
		evs = append(evs, PeerLost{Rank: num("rank", 0), Peers: ps})
	case "copies-corrupt":
		var hs []int
		for _, x := range strings.Split(a["holders"], ",") {
			n, _ := strconv.Atoi(x)
			hs = append(hs, n)
		}
		evs = append(evs, CopiesCorrupt{Rank: num("rank", 0), Step: int64(num("step", int(m.g))), Holders: hs})
	case "gpu":
		evs = append(evs, GPUHealth{Host: num("host", 0), GPU: num("gpu", 0), Class: a["class"], Msg: a["msg"]})
	case "progress":
		if a["rank"] == "all" {
			for r := range m.rankHost {
				evs = append(evs, Progress{Rank: r, Step: int64(num("step", 0))})
			}
		} else {
			evs = append(evs, Progress{Rank: num("rank", 0), Step: int64(num("step", 0))})
		}
	case "signal":
		evs = append(evs, Signal{Sig: sig(a["sig"])})
	case "tick":
		evs = append(evs, Tick{})
	case "g":
		evs = append(evs, GPublished{G: int64(num("g", 0))})
	case "replicated":
		evs = append(evs, Replicated{Owner: num("owner", -1)})
	case "committed":
		evs = append(evs, DiskCommitted{Step: int64(num("step", 0))})
	case "disk-reach":
		evs = append(evs, DiskReach{Epoch: uint64(num("epoch", int(m.epoch))), T: int64(num("t", -1)), Err: a["err"]})
	case "recovery":
		st := map[string]Stage{"published": StagePublished, "restored": StageRestored, "resumed": StageResumed}[a["stage"]]
		evs = append(evs, RecoveryReport{Epoch: uint64(num("epoch", int(m.epoch))), Stage: st})
	default:
		return "error: unknown event " + kind
	}
	var lines []string
	for _, e := range evs {
		for _, x := range m.Step(d.now, e) {
			lines = append(lines, x.String())
		}
	}
	if hasKey(a, "state") {
		lines = append(lines, d.state())
	}
	if len(lines) == 0 {
		return "(no action)"
	}
	return strings.Join(lines, "\n")
}

func sig(s string) syscall.Signal {
	for _, x := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGSEGV, syscall.SIGABRT, syscall.SIGQUIT} {
		if SignalName(x) == s {
			return x
		}
	}
	n, _ := strconv.Atoi(s)
	return syscall.Signal(n)
}
