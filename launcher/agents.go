package launcher

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/topology"
)

// hostAgent is the launcher's record of one agent of the job and of the
// host it runs on: the host itself is topo (a topology.Host of the
// hostfile) and index its place in job.hosts, the host index of the
// machine and of the wire messages. Fields below lastSeen are owned by the
// job loop.
type hostAgent struct {
	index    int
	name     string
	topo     topology.Host // as the hostfile gave it
	spare    bool          // started without ranks, to replace a lost host
	local    bool
	lastSeen atomic.Int64 // unix nanoseconds of the last message from the agent
	beatSent atomic.Int64 // unix nanoseconds of the last heartbeat passed to the loop
	fenced   atomic.Bool  // lost: its messages are dropped from now on
	probed   atomic.Bool  // suspected and asked for a heartbeat: the next one goes to the loop at once
	tail     *tail        // the agent's last stderr lines
	// ranks are the host's ranks in the current epoch, in local-rank
	// order: written by the loop under job.tab.
	ranks []int
	// epoch is the newest epoch whose table the agent reported having
	// (wire.EventEpoch); the loop's.
	epoch uint64
	// ranGen is 1 + the newest generation in which the agent started a
	// rank (0: none yet); the loop's. Only such a host owes the
	// generation's output end marker: a spare that took ranks the job
	// stopped before starting owes none.
	ranGen uint64

	// What a restart leaves as it is: the agent is the same one, registered
	// once, and its heartbeats keep lastSeen fresh throughout. Whether the
	// host's ranks are done is not kept here but read from the job's ranks
	// of the current generation (job.hostDone), which a restart resets.
	started    time.Time
	registered bool
	lost       bool           // the host is lost and its ranks accounted for; for good
	ended      bool           // the agent itself has ended; for good
	released   bool           // its start slot is free again
	kill       func()         // guarded by job.mu
	stream     io.WriteCloser // the agent's stdin (its "launcher alive" stream); guarded by job.mu
}

// agentExit reports the end of an agent (process or in-process goroutine).
type agentExit struct {
	host int
	err  error
}

// tail keeps the last lines an agent wrote on its stderr, for reports.
type tail struct {
	mu    sync.Mutex // guards lines
	lines []string
}

const tailLines = 20

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == tailLines {
		copy(t.lines, t.lines[1:])
		t.lines = t.lines[:tailLines-1]
	}
	t.lines = append(t.lines, line)
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return ""
	}
	return strings.Join(t.lines, "\n")
}

// LocalHostMatcher returns a function that reports whether a host name is
// the launcher's own host: localhost, this host's name (short or fully
// qualified, in any case), or an IP address of one of its interfaces. It
// reads this host's names and addresses at most once each, when a name
// first needs them, and does no name resolution.
func LocalHostMatcher() func(name string) bool { return newLocalMatcher().match }

// localMatcher tells this host's names and addresses, each read once,
// when a name first needs it (a job of many hosts asks for each; the
// default host, localhost, needs neither: an interface dump is a
// netlink round trip on the launch's path).
type localMatcher struct {
	namesOnce sync.Once
	hostname  string
	short     string
	addrsOnce sync.Once
	addrs     []net.IP
}

func newLocalMatcher() *localMatcher { return &localMatcher{} }

// names reads this host's name, lower case, and its first label.
func (m *localMatcher) names() (hostname, short string) {
	m.namesOnce.Do(func() {
		if hn, err := os.Hostname(); err == nil {
			m.hostname = strings.ToLower(hn)
			m.short, _, _ = strings.Cut(m.hostname, ".")
		}
	})
	return m.hostname, m.short
}

// interfaceAddrs reads the addresses of this host's interfaces.
func (m *localMatcher) interfaceAddrs() []net.IP {
	m.addrsOnce.Do(func() {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					m.addrs = append(m.addrs, n.IP)
				}
			}
		}
	})
	return m.addrs
}

func (m *localMatcher) match(name string) bool {
	name = strings.ToLower(name)
	switch name {
	case "localhost", "localhost.localdomain", "127.0.0.1", "::1":
		return true
	}
	ip := net.ParseIP(name)
	if ip == nil {
		// node1, node1.cluster and NODE1 are all this host when it is node1
		// or node1.cluster; host names repeat across domains in no cluster.
		hostname, short := m.names()
		nameShort, _, _ := strings.Cut(name, ".")
		return short != "" && (name == hostname || nameShort == short)
	}
	if ip.IsLoopback() {
		return true
	}
	for _, a := range m.interfaceAddrs() {
		if a.Equal(ip) {
			return true
		}
	}
	return false
}

// startRemote starts h's agent with the rsh command and hands it its
// host's credentials (jobkey.HostCredentials: never the job secret) on its
// stdin, which stays open: the agent takes its end as the launcher's. The agent's stderr is forwarded to the terminal and kept for
// reports.
func (j *job) startRemote(ctx context.Context, h *hostAgent) error {
	args := append(append([]string{}, j.cfg.Rsh[1:]...), h.name, j.cfg.AgentPath, "agent",
		"--job", j.id, "--host-index", strconv.Itoa(h.index), "--host-name", h.name, "--control", j.controlURL(h))
	if j.verbose {
		args = append(args, "-v")
	}
	cmd := exec.Command(j.cfg.Rsh[0], args...)
	// Its own process group, so a Ctrl-C on the terminal reaches only gorun,
	// which decides; SIGTERM if gorun dies, which the agent acts on.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("starting agent on %s: %w", h.name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("starting agent on %s: %w", h.name, err)
	}
	cmd.Stdout = nil
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting agent on %s with %q: %w", h.name, j.cfg.Rsh[0], err)
	}
	j.started(h, stdin, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	// The pipe buffer holds the line even if the agent has not started
	// reading. With TLS it carries the certificate's pin.
	creds := j.secret.HostCredentials(h.index, j.srv.Fingerprint())
	if _, err := io.WriteString(stdin, creds.Encode()+"\n"); err != nil {
		j.log.Debug("writing credentials to agent", "host", h.name, "err", err)
	}
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 4096), 64<<10)
		for sc.Scan() {
			h.tail.add(sc.Text())
			j.out.agentLine(h.name, sc.Bytes())
		}
	}()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		readers.Wait()
		err := cmd.Wait()
		j.agentExits <- agentExit{host: h.index, err: err}
	}()
	return nil
}
