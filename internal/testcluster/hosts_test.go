package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const helperPort = "7777" // every host has its own port space

// serveID listens on addr:0 in the root namespace, answering every
// connection with id, until the test ends. It returns the listening address.
func serveID(t *testing.T, addr, id string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, id)
			c.Close()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// dialFrom runs the dial helper in host with targets "ADDR=ID" (expect ID)
// or "ADDR=-" (expect no connection) and fails the test if any is not met.
func dialFrom(t *testing.T, h *Hosts, host int, targets ...string) {
	t.Helper()
	out, err := helperCmd(t.Context(), t, h, host, "dial", targets...).CombinedOutput()
	if err != nil {
		t.Errorf("dialing from %s: %v\n%s", h.Names[host], err, out)
	}
}

func hostPort(addr string) string { return net.JoinHostPort(addr, helperPort) }

func TestReachability(t *testing.T) {
	t.Parallel()
	h := newHosts(t, 4)
	bridge := serveID(t, h.BridgeAddr, "bridge")
	for i := range h.Names {
		startHelper(t, h, i, "listen", h.Names[i], hostPort(h.Addrs[i]), "127.0.0.1:"+helperPort)
	}
	for i := range h.Names { // root -> host
		if got, err := dialID(hostPort(h.Addrs[i]), 5*time.Second); err != nil || got != h.Names[i] {
			t.Errorf("root -> %s: got %q, %v; want %q", h.Addrs[i], got, err, h.Names[i])
		}
	}
	for i := range h.Names { // host -> every host, the bridge, and its own loopback
		targets := []string{bridge + "=bridge", "127.0.0.1:" + helperPort + "=" + h.Names[i]}
		for j := range h.Names {
			targets = append(targets, hostPort(h.Addrs[j])+"="+h.Names[j])
		}
		dialFrom(t, h, i, targets...)
	}
	fwd, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", h.Bridge, "forwarding"))
	if err != nil || strings.TrimSpace(string(fwd)) != "0" {
		t.Errorf("forwarding on %s: %q, %v; want 0", h.Bridge, fwd, err)
	}
}

// TestClustersIsolated checks that the root namespace routes nothing from
// one cluster's bridge to another's.
func TestClustersIsolated(t *testing.T) {
	t.Parallel()
	a, b := newHosts(t, 1), newHosts(t, 1)
	if a.BridgeAddr == b.BridgeAddr {
		t.Fatalf("two clusters share bridge address %s", a.BridgeAddr)
	}
	startHelper(t, b, 0, "listen", "b0", hostPort(b.Addrs[0]))
	aBridge := serveID(t, a.BridgeAddr, "a-bridge")
	if got, err := dialID(hostPort(b.Addrs[0]), 5*time.Second); err != nil || got != "b0" {
		t.Fatalf("root -> b0: got %q, %v", got, err)
	}
	dialFrom(t, a, 0, aBridge+"=a-bridge", hostPort(b.Addrs[0])+"=-")
}

func TestLinkDownUp(t *testing.T) {
	t.Parallel()
	h := newHosts(t, 2)
	bridge := serveID(t, h.BridgeAddr, "bridge")
	l := startHelper(t, h, 0, "listen", h.Names[0], hostPort(h.Addrs[0]))
	reach := func() error {
		got, err := dialID(hostPort(h.Addrs[0]), 300*time.Millisecond)
		if err == nil && got != h.Names[0] {
			err = fmt.Errorf("reached %q, want %q", got, h.Names[0])
		}
		return err
	}
	if err := reach(); err != nil {
		t.Fatalf("before LinkDown: %v", err)
	}
	dialFrom(t, h, 1, hostPort(h.Addrs[0])+"="+h.Names[0])

	if err := h.LinkDown(0); err != nil {
		t.Fatal(err)
	}
	if err := reach(); err == nil {
		t.Errorf("root reached %s after LinkDown(0)", h.Addrs[0])
	}
	dialFrom(t, h, 1, hostPort(h.Addrs[0])+"=-")
	dialFrom(t, h, 0, bridge+"=-", hostPort(h.Addrs[1])+"=-")
	if l.exited() {
		t.Fatalf("listener in host 0 exited on LinkDown: %v", l.err)
	}

	if err := h.LinkUp(0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, reach)
	dialFrom(t, h, 1, hostPort(h.Addrs[0])+"="+h.Names[0])
	dialFrom(t, h, 0, bridge+"=bridge")

	killAll := func(x int) error { return h.KillAll(x) }
	for _, f := range []func(int) error{h.LinkDown, h.LinkUp, killAll, h.StopAll} {
		if err := f(2); err == nil {
			t.Errorf("host 2 of 2: no error")
		}
	}
}

func TestKillAll(t *testing.T) {
	t.Parallel()
	h := newHosts(t, 2)
	victim := startHelper(t, h, 0, "spawn")
	grandchild, err := strconv.Atoi(victim.lines[0])
	if err != nil {
		t.Fatalf("spawn printed %q: %v", victim.lines, err)
	}
	bystander := startHelper(t, h, 1, "sleep")
	pids, err := nsPids(h.Names[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, victim.cmd.Process.Pid) || !slices.Contains(pids, grandchild) {
		t.Fatalf("pids in %s: %v; want %d and %d", h.Names[0], pids, victim.cmd.Process.Pid, grandchild)
	}

	if err := h.KillAll(0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-victim.done:
	case <-time.After(10 * time.Second):
		t.Fatal("process in host 0 still running 10s after KillAll(0)")
	}
	var ee *exec.ExitError
	if !errors.As(victim.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("victim ended with %v; want SIGKILL", victim.err)
	}
	if pids, err := nsPids(h.Names[0]); err != nil || len(pids) != 0 {
		t.Errorf("after KillAll(0), pids in %s: %v, %v; want none", h.Names[0], pids, err)
	}
	if bystander.exited() {
		t.Errorf("process in host 1 died of KillAll(0): %v", bystander.err)
	}

	// The host is still there: it can be "rebooted".
	if err := h.KillAll(0); err != nil {
		t.Errorf("KillAll of an empty host: %v", err)
	}
	startHelper(t, h, 0, "sleep")
}

// TestKillAllTogether: KillAll of several hosts ends every process of
// each; a bad host among them is refused before any is killed.
func TestKillAllTogether(t *testing.T) {
	t.Parallel()
	h := newHosts(t, 3)
	a := startHelper(t, h, 0, "sleep")
	b := startHelper(t, h, 1, "spawn")
	bystander := startHelper(t, h, 2, "sleep")
	if err := h.KillAll(0, 3); err == nil {
		t.Errorf("KillAll(0, 3) of 3 hosts: no error")
	}
	if a.exited() {
		t.Fatalf("KillAll(0, 3) killed host 0's process before refusing host 3: %v", a.err)
	}
	if err := h.KillAll(0, 1); err != nil {
		t.Fatal(err)
	}
	for i, v := range []*proc{a, b} {
		select {
		case <-v.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("process in host %d still running 10s after KillAll(0, 1)", i)
		}
		if pids, err := nsPids(h.Names[i]); err != nil || len(pids) != 0 {
			t.Errorf("after KillAll(0, 1), pids in %s: %v, %v; want none", h.Names[i], pids, err)
		}
	}
	if bystander.exited() {
		t.Errorf("process in host 2 died of KillAll(0, 1): %v", bystander.err)
	}
}

// TestStopAll: a frozen host's processes are stopped, not ended, when
// StopAll returns; ContAll has them go on, and KillAll still ends them.
func TestStopAll(t *testing.T) {
	t.Parallel()
	h := newHosts(t, 2)
	victim := startHelper(t, h, 0, "sleep")
	bystander := startHelper(t, h, 1, "sleep")
	if err := h.StopAll(0); err != nil {
		t.Fatal(err)
	}
	pid := victim.cmd.Process.Pid
	state := func(pid int) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return "gone"
		}
		// pid (comm) S ...: the state follows the last ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return f[0]
	}
	// StopAll returns once the process is stopped.
	if s := state(pid); s != "T" {
		t.Fatalf("process in host 0 in state %q when StopAll(0) returned, want T (stopped)", s)
	}
	if victim.exited() {
		t.Fatalf("StopAll ended the process: %v", victim.err)
	}
	if s := state(bystander.cmd.Process.Pid); s == "T" || bystander.exited() {
		t.Errorf("process in host 1 stopped or ended by StopAll(0): state %s", s)
	}
	if err := h.ContAll(0); err != nil {
		t.Fatal(err)
	}
	if s := state(pid); s == "T" || victim.exited() {
		t.Fatalf("process in host 0 in state %q after ContAll(0), want it going on", s)
	}
	if err := h.StopAll(0); err != nil {
		t.Fatal(err)
	}
	if err := h.KillAll(0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-victim.done:
	case <-time.After(10 * time.Second):
		t.Fatal("stopped process in host 0 still there 10s after KillAll(0)")
	}
}

// TestCleanup checks that a cluster's cleanup kills its processes and
// leaves no namespace, link or address behind.
func TestCleanup(t *testing.T) {
	t.Parallel()
	var h *Hosts
	t.Run("cluster", func(t *testing.T) {
		done := make(chan struct{})
		var cmd *exec.Cmd
		// Registered before NetnsHosts, so it runs after the cluster's cleanup.
		t.Cleanup(func() {
			if cmd == nil {
				return
			}
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Errorf("process in %s survived the cluster's cleanup", h.Names[2])
				cmd.Process.Kill()
				<-done
			}
		})
		h = newHosts(t, 3)
		// Not tied to the test's context: only the cluster cleanup ends it.
		cmd = helperCmd(context.Background(), t, h, 2, "sleep")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			cmd.Wait()
			close(done)
		}()
		waitFor(t, 10*time.Second, func() error {
			pids, err := nsPids(h.Names[2])
			if err == nil && !slices.Contains(pids, cmd.Process.Pid) {
				err = fmt.Errorf("pid %d not in %s: %v", cmd.Process.Pid, h.Names[2], pids)
			}
			return err
		})
	})
	if h == nil {
		t.Skip("no cluster was made")
	}
	nss, err := listNetns()
	if err != nil {
		t.Fatal(err)
	}
	links, err := listLinks()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Concat(h.Names, h.Veths, []string{h.Bridge}) {
		if slices.Contains(nss, name) || slices.Contains(links, name) {
			t.Errorf("%s still present after cleanup", name)
		}
	}
	if err := leftovers(h.tag); err != nil {
		t.Error(err)
	}
	addrs, err := listAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.addr.String() == h.BridgeAddr {
			t.Errorf("bridge address %s still on %s", h.BridgeAddr, a.dev)
		}
	}
}

// TestCleanupStale plants the leftovers of a crashed run (a cluster with a
// process still in it, named for this pid but not live in this process) and
// checks that CleanupStale removes them and nothing else. It is not
// parallel: other tests' NetnsHosts would race it to the cleanup.
func TestCleanupStale(t *testing.T) {
	h := newHosts(t, 1)
	tag, err := newTag()
	if err != nil {
		t.Fatal(err)
	}
	releaseTag(tag)
	t.Cleanup(func() { removeCluster(tag) }) // in case the test fails first
	stray, err := create(tag, 2)
	if err != nil {
		t.Fatal(err)
	}
	cmd := helperCmd(context.Background(), t, stray, 1, "sleep")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, 10*time.Second, func() error {
		pids, err := nsPids(stray.Names[1])
		if err == nil && len(pids) == 0 {
			err = fmt.Errorf("no process in %s yet", stray.Names[1])
		}
		return err
	})

	if err := CleanupStale(); err != nil {
		t.Fatal(err)
	}
	if err := leftovers(tag); err != nil {
		t.Error(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("process in the stale cluster survived CleanupStale")
	}
	nss, err := listNetns()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(nss, h.Names[0]) {
		t.Errorf("CleanupStale removed live namespace %s", h.Names[0])
	}
}

// selfExe is this test binary's path.
func selfExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// deadPid runs this test binary to its end and returns its pid: a process
// that existed and is gone, as a killed test's.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(selfExe(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), raceEnv())
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestStale(t *testing.T) {
	dead := deadPid(t)

	// A killed child not yet waited for is a zombie: dead for our purposes.
	zcmd := exec.Command(selfExe(t))
	zcmd.Env = helperEnviron("sleep")
	helperUsed.Store("sleep", true)
	if err := zcmd.Start(); err != nil {
		t.Fatal(err)
	}
	zombie := zcmd.Process.Pid
	defer zcmd.Wait()
	zcmd.Process.Kill()
	waitFor(t, 10*time.Second, func() error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", zombie))
		if err == nil && !strings.Contains(string(stat), ") Z ") {
			err = fmt.Errorf("pid %d not a zombie yet: %s", zombie, stat)
		}
		return err
	})

	tag, err := newTag()
	if err != nil {
		t.Fatal(err)
	}
	defer releaseTag(tag)
	for _, tc := range []struct {
		name string
		tag  string
		pid  int
		want bool
	}{
		{"dead pid", makeTag(dead, 0), dead, true},
		{"zombie pid", makeTag(zombie, 0), zombie, true},
		{"live pid", makeTag(os.Getppid(), 0), os.Getppid(), false},
		{"own live tag", tag, os.Getpid(), false},
		{"own unknown tag", makeTag(os.Getpid(), 1295), os.Getpid(), !isLive(makeTag(os.Getpid(), 1295))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stale(tc.tag, tc.pid); got != tc.want {
				t.Errorf("stale(%s, %d) = %v, want %v", tc.tag, tc.pid, got, tc.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, pid := range []int{1, 4194304, os.Getpid()} {
		for _, ctr := range []int{0, 35, 1295, 1296} {
			tag := makeTag(pid, ctr)
			if len(tag) != tagLen {
				t.Errorf("makeTag(%d, %d) = %q: length %d, want %d", pid, ctr, tag, len(tag), tagLen)
			}
			for _, name := range []string{nsName(tag, maxHosts-1), bridgeName(tag), vethName(tag, maxHosts-1)} {
				gotTag, gotPid, ok := tagOf(name)
				if !ok || gotTag != tag || gotPid != pid {
					t.Errorf("tagOf(%q) = %q, %d, %v; want %q, %d, true", name, gotTag, gotPid, ok, tag, pid)
				}
			}
			for _, link := range []string{bridgeName(tag), vethName(tag, maxHosts-1)} {
				if len(link) > 15 {
					t.Errorf("link name %q is %d bytes, more than IFNAMSIZ-1", link, len(link))
				}
			}
		}
	}
	for _, name := range []string{"", "eth0", "grt", "grt0000000", "grt0000000h0", "grtABCDE00-h0", "grt00000-0-h0", "xrt0000000-h0"} {
		if tag, pid, ok := tagOf(name); ok {
			t.Errorf("tagOf(%q) = %q, %d, true; want not ours", name, tag, pid)
		}
	}
}

func TestWriteHostfile(t *testing.T) {
	h := &Hosts{Names: []string{"h0", "h1", "h2"}}
	path := h.WriteHostfile(t, t.TempDir(), 4, "rack=r1", "", "rack=r2 spare")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "h0 slots=4 rack=r1\nh1 slots=4\nh2 slots=4 rack=r2 spare\n"
	if string(got) != want {
		t.Errorf("hostfile:\n%s\nwant:\n%s", got, want)
	}
	if path := h.WriteHostfile(t, "", 1); filepath.Base(path) != "hostfile" {
		t.Errorf("WriteHostfile with dir \"\" wrote %s", path)
	}
}

func TestExecBadHost(t *testing.T) {
	h := &Hosts{Names: []string{"h0"}}
	for _, host := range []int{-1, 1} {
		if err := h.Exec(t.Context(), host, "true").Run(); err == nil {
			t.Errorf("Exec on host %d of 1 ran", host)
		}
	}
}

// TestCleanupStaleSlurm plants what a killed test's Slurm cluster leaves
// in the root namespace (a daemon, a salloc: processes whose SLURM_CONF is
// in a cluster directory named for a dead test process, and the
// directory) next to a live cluster's, and checks that CleanupStale ends
// the dead one's processes, removes its directory and leaves the live
// one's alone.
func TestCleanupStaleSlurm(t *testing.T) {
	exe, dead := selfExe(t), deadPid(t)
	tag, err := newTag()
	if err != nil {
		t.Fatal(err)
	}
	defer releaseTag(tag)
	start := func(owner string) (dir string, pid int, done chan error) {
		dir, err := os.MkdirTemp("", owner+"-slurm-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		p := exec.Command(exe)
		p.Env = append(helperEnviron("sleep"), "SLURM_CONF="+filepath.Join(dir, "slurm.conf"))
		helperUsed.Store("sleep", true)
		out, err := p.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Process.Kill() })
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("helper: %q, %v", line, err)
		}
		done = make(chan error, 1)
		go func() { done <- p.Wait() }()
		return dir, p.Process.Pid, done
	}
	staleDir, _, staleDone := start(makeTag(dead, 0))
	liveDir, livePid, _ := start(tag)

	if err := CleanupStale(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-staleDone:
	case <-time.After(10 * time.Second):
		t.Error("the dead test's Slurm process survived CleanupStale")
	}
	if _, err := os.Stat(staleDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead test's Slurm directory %s: %v, want it removed", staleDir, err)
	}
	// (Weak: a process CleanupStale had just killed could still look alive.)
	if !pidAlive(livePid) {
		t.Error("CleanupStale ended a live cluster's process")
	}
	if _, err := os.Stat(liveDir); err != nil {
		t.Errorf("a live cluster's directory: %v", err)
	}
}
