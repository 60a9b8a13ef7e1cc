package agent

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/nats-io/nats.go"
)

// Hot-swap on the agent's side (issue 14): a launcher-side test double
// publishes the epoch tables a recovery publishes (control.Rendezvous.Fence
// and Publish); one host runs a real agent, the others are registered by
// the test (their agents are not needed for what one agent does).

// probeDirVar names the directory where rankProbe writes what it saw;
// probeProtectVar, when set, has it open a state-protection session too.
// probeHoldVar, when set, has the probes of generation 0 leave a process
// in a session of its own that holds their standard output open, so that
// the agent sees their end drainTimeout after they are killed: a window in
// which the tables of a recovery arrive while the ranks are being stopped.
const (
	probeDirVar     = "AGENTTEST_PROBE_DIR"
	probeProtectVar = "AGENTTEST_PROBE_PROTECT"
	probeHoldVar    = "AGENTTEST_PROBE_HOLD"
)

// rankProbe is a rank that records its environment (GORUN_*, TMPDIR) in
// rank-<rank>-gen-<restart count>-epoch-<epoch>.env, opens its rank socket,
// writes rank-<rank>.welcome once welcomed, and appends "epoch <n>" to
// rank-<rank>.pushes for every epoch pushed to it. With probeProtectVar
// set, it first connects to its rank service and asks for its restore,
// and writes rank-<rank>-gen-<restart count>.protect: "step <n>" or the
// error. It runs until killed.
func rankProbe() int {
	dir := os.Getenv(probeDirVar)
	me, epoch, gen := os.Getenv(wire.EnvRank), os.Getenv(wire.EnvEpoch), os.Getenv(wire.EnvRestartCount)
	if os.Getenv(probeHoldVar) != "" && gen == "0" {
		// Killed with the job's other leftovers (its environment is the
		// job's): by the agent's restart, or its cleanup.
		hold := exec.Command("sleep", "3600")
		hold.Stdout = os.Stdout
		hold.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := hold.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "hold:", err)
			return 1
		}
	}
	name := filepath.Join(dir, "rank-"+me+"-gen-"+gen+"-epoch-"+epoch+".env")
	var env strings.Builder
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GORUN_") || strings.HasPrefix(kv, "TMPDIR=") {
			env.WriteString(kv + "\n")
		}
	}
	if err := writeAtomic(name, env.String()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Getenv(probeProtectVar) != "" {
		res := "error: "
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		p, err := protect.Connect(ctx, []protect.Region{{Name: "optimizer", Size: 64}}, protect.Options{})
		if err == nil {
			var r *protect.Restored
			if r, err = p.Restore(ctx); err == nil {
				res = fmt.Sprintf("step %d", r.Step)
			}
		}
		cancel()
		if err != nil {
			res += err.Error()
		}
		if err := writeAtomic(filepath.Join(dir, "rank-"+me+"-gen-"+gen+".protect"), res); err != nil {
			return 1
		}
	}
	c, err := net.Dial("unix", os.Getenv(wire.EnvSocket))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	if err := wire.WriteSock(c, wire.SockHello, &wire.Hello{Version: wire.SockVersion, Pid: os.Getpid()}); err != nil {
		return 1
	}
	if typ, _, err := wire.ReadSock(c); err != nil || typ != wire.SockWelcome {
		fmt.Fprintln(os.Stderr, "welcome:", typ, err)
		return 1
	}
	if err := writeAtomic(filepath.Join(dir, "rank-"+me+".welcome"), ""); err != nil {
		return 1
	}
	for {
		typ, b, err := wire.ReadSock(c)
		if err != nil {
			break
		}
		var w wire.Welcome
		if typ != wire.SockEpoch || wire.DecodeSock(b, &w) != nil {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, "rank-"+me+".pushes"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			fmt.Fprintf(f, "epoch %d\n", w.Epoch)
			f.Close()
		}
	}
	for {
		time.Sleep(time.Hour) // until killed
	}
}

func writeAtomic(name, s string) error {
	if err := os.WriteFile(name+".tmp", []byte(s), 0o600); err != nil {
		return err
	}
	return os.Rename(name+".tmp", name)
}

// swapJob is a job of several hosts, one of which (host agent) runs a
// real agent, whose ranks are rankProbes.
type swapJob struct {
	t        *testing.T
	job      string
	ctx      context.Context
	l        *control.Control
	rv       *control.Rendezvous
	dir      string // the probes' directory
	agent    int
	control  string           // the launcher's control subject
	events   chan *wire.Event // the agent's
	agentErr chan error
	exited   bool // agentErr was read
	// register registers host h as the test does, as its own user.
	register func(h int)
}

// swapOpts are a swapJob's options beyond its hosts.
type swapOpts struct {
	with        func(*Config)    // when not nil, changes the agent's Config
	holders     []wire.HolderRow // the replica holders (none: no replicas)
	protect     bool             // rankprobe opens a state-protection session
	hold        bool             // rankprobe holds its output open (probeHoldVar)
	probe       string           // the ranks' helper (default rankprobe)
	replicaPort int              // the replication port the hosts the test registers give
	later       []int            // hosts the test registers later (swapJob.register), not at the start
}

// startSwapJob starts the rendezvous of hosts, registers every host but
// agent itself, and runs the agent of host agent.
func startSwapJob(t *testing.T, job string, hosts []control.RendezvousHost, agent int, o swapOpts) *swapJob {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	users := make([]ctlserver.HostUser, len(hosts))
	for h := range hosts {
		users[h] = ctlserver.HostUser{Password: secret.HostCredentials(h, nil).InProcessPassword()}
	}
	srv, err := ctlserver.Start(ctlserver.Config{Job: job, LocalPassword: secret.InProcessPassword(), Hosts: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	l, err := control.DialInProcess(ctx, srv.InProcess(), secret, control.ControlOptions{Name: "launcher"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	j := &swapJob{t: t, job: job, ctx: ctx, l: l, dir: t.TempDir(), agent: agent, control: wire.JobSubjects(job).Control, events: make(chan *wire.Event, 1024), agentErr: make(chan error, 1)}
	sub, err := l.Subscribe(wire.JobSubjects(job).ForHost(agent).Events, func(m *nats.Msg) {
		if e, err := wire.DecodeEvent(m.Data); err == nil {
			j.events <- e
		} else {
			t.Errorf("the agent sent a bad event: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	env := []string{agenttestHelper + "=" + cmp.Or(o.probe, "rankprobe"), probeDirVar + "=" + j.dir}
	if o.protect {
		env = append(env, probeProtectVar+"=1")
	}
	if o.hold {
		env = append(env, probeHoldVar+"=1")
	}
	j.rv, err = control.StartRendezvous(l.Conn, job, 0, hosts, &wire.JobSpec{
		Prog: os.Args[0], Env: env, Dir: t.TempDir(),
		KillGrace: time.Second, HeartbeatInterval: time.Second, StdinRank: wire.NoStdin, NoPMI: true,
	}, o.holders, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.rv.Close)
	j.register = func(h int) {
		t.Helper()
		// As the host's own user, from its inbox (the rendezvous answers
		// nowhere else).
		hc, err := control.DialInProcessHost(ctx, srv.InProcess(), secret.HostCredentials(h, nil),
			control.ControlOptions{Name: "host " + hosts[h].Name, InboxPrefix: wire.JobSubjects(job).ForHost(h).Inbox})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hc.Close)
		jr, err := control.JoinRendezvous(hc.Conn, job, h)
		if err != nil {
			t.Fatal(err)
		}
		_, err = jr.Register(ctx, &wire.Register{Version: wire.Version, Job: job, Host: h, Name: hosts[h].Name, Addr: "127.0.0.1", MasterPort: 1, ReplicaPort: o.replicaPort, Pid: 1})
		jr.Close()
		if err != nil {
			t.Fatalf("registering host %d: %v", h, err)
		}
	}
	for h := range hosts {
		if h != agent && !slices.Contains(o.later, h) {
			j.register(h)
		}
	}
	creds := secret.HostCredentials(agent, nil)
	cfg := Config{Job: job, Host: agent, Name: hosts[agent].Name, Creds: creds, Addr: "127.0.0.1", Logger: testLogger(t),
		Dial: func(ctx context.Context, o control.ControlOptions) (*control.Control, error) {
			return control.DialInProcessHost(ctx, srv.InProcess(), creds, o)
		}}
	if o.with != nil {
		o.with(&cfg)
	}
	go func() { j.agentErr <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		if j.exited {
			return
		}
		_ = l.Publish(wire.JobSubjects(job).Control, wire.Marshal(&wire.Control{Op: wire.OpExit}))
		select {
		case <-j.agentErr:
		case <-time.After(30 * time.Second):
			t.Error("the agent did not exit")
		}
	})
	return j
}

// waitExit waits for the agent to exit (told to) and reports an error
// it ended with.
func (j *swapJob) waitExit(t *testing.T) {
	t.Helper()
	select {
	case err := <-j.agentErr:
		j.exited = true
		if err != nil {
			t.Errorf("the agent ended with %v", err)
		}
	case <-j.ctx.Done():
		t.Fatal("the agent did not exit")
	}
}

func (j *swapJob) send(c *wire.Control) {
	j.t.Helper()
	if err := j.l.Publish(j.control, wire.Marshal(c)); err != nil {
		j.t.Fatal(err)
	}
	if err := j.l.Flush(); err != nil {
		j.t.Fatal(err)
	}
}

// until returns the agent's events up to the first that done accepts.
func (j *swapJob) until(what string, done func(*wire.Event) bool) []*wire.Event {
	j.t.Helper()
	var seen []*wire.Event
	for {
		select {
		case e := <-j.events:
			seen = append(seen, e)
			if done(e) {
				return seen
			}
		case err := <-j.agentErr:
			j.exited = true
			j.t.Fatalf("the agent ended (%v) while the test waited for %s", err, what)
		case <-j.ctx.Done():
			j.t.Fatalf("no %s; events: %v", what, describe(seen))
		}
	}
}

// epochEvent accepts the agent's EventEpoch for epoch.
func epochEvent(epoch uint64) func(*wire.Event) bool {
	return func(e *wire.Event) bool { return e.Kind == wire.EventEpoch && e.Epoch == epoch }
}

func describe(es []*wire.Event) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "\n  %s host=%d rank=%d gen=%d epoch=%d %s", e.Kind, e.Host, e.Rank, e.Gen, e.Epoch, e.Msg)
	}
	return b.String()
}

// waitFile waits for the probe's file name to exist, and returns its
// contents.
func (j *swapJob) waitFile(name string) string {
	j.t.Helper()
	for {
		b, err := os.ReadFile(filepath.Join(j.dir, name))
		if err == nil {
			return string(b)
		}
		select {
		case <-j.ctx.Done():
			ls, _ := os.ReadDir(j.dir)
			var names []string
			for _, e := range ls {
				names = append(names, e.Name())
			}
			j.t.Fatalf("no %s from the ranks (they wrote %v)", name, names)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// checkEnv checks that env (rankProbe's record) has every variable of want.
func checkEnv(t *testing.T, what, env string, want map[string]string) {
	t.Helper()
	have := map[string]string{}
	for _, line := range strings.Split(env, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			have[k] = v
		}
	}
	for k, v := range want {
		if have[k] != v {
			t.Errorf("%s: %s=%q, want %q", what, k, have[k], v)
		}
	}
}
