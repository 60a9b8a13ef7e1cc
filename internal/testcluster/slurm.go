package testcluster

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// slurmTools are the programs StartSlurm runs.
var slurmTools = []string{"munged", "slurmctld", "slurmd", "salloc", "srun", "sinfo", "scontrol", "squeue", "scancel"}

// slurmUp bounds how long StartSlurm waits for every node to be idle.
const slurmUp = 20 * time.Second

// Slurm is a Slurm cluster on namespace hosts: a munged and a slurmctld
// in the root namespace, one slurmd in each host, whose NodeName is the
// host's name and NodeAddr its address. Commands run with Env (SLURM_CONF)
// reach it.
type Slurm struct {
	Hosts *Hosts
	Conf  string   // its slurm.conf
	Env   []string // os.Environ() with SLURM_CONF set to Conf

	dir   string
	procs []*exec.Cmd // daemons StartSlurm started, to be killed at cleanup
}

// StartSlurm starts a Slurm cluster on h and registers t.Cleanup to stop
// it. Without Slurm's and munge's programs it skips the test (fails it
// under GORUN_TESTCLUSTER_REQUIRE=1); it fails it on any other error or
// when the nodes are not all idle within 20 seconds. Each node has 2 CPUs,
// process tracking by ancestry (proctrack/linuxproc: no cgroups needed),
// no task binding and a cgroup plugin that uses none of the host's
// cgroups (whatever their version); a node that comes back is returned to
// service.
func StartSlurm(t testing.TB, h *Hosts) *Slurm {
	t.Helper()
	for _, tool := range slurmTools {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err2 := os.Stat(filepath.Join("/usr/sbin", tool)); err2 == nil {
				continue
			}
			msg := fmt.Sprintf("testcluster: %s not found (apt-get install slurmctld slurmd slurm-client munge)", tool)
			if os.Getenv(requireEnv) == "1" {
				t.Fatalf("%s (and %s=1)", msg, requireEnv)
			}
			t.Skip(msg)
		}
	}
	// Named for h's tag, so that CleanupStale finds what a killed test
	// left (cleanupStaleSlurm).
	dir, err := os.MkdirTemp("", h.tag+slurmDirInfix)
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	s := &Slurm{Hosts: h, dir: dir}
	t.Cleanup(s.stop)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// Command returns a command that runs a Slurm client (salloc, srun,
// squeue, ...) against s, in the root namespace.
func (s *Slurm) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = s.Env
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Output runs a Slurm client and returns its standard output.
func (s *Slurm) Output(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	out, err := s.Command(ctx, name, args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return string(out), fmt.Errorf("testcluster: %s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

func (s *Slurm) start() error {
	munge := filepath.Join(s.dir, "munge")
	if err := os.Mkdir(munge, 0o700); err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("testcluster: munge key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(munge, "key"), key, 0o400); err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	// Every daemon has SLURM_CONF in its environment: it marks it as this
	// cluster's for cleanupStaleSlurm.
	s.Conf = filepath.Join(s.dir, "slurm.conf")
	s.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	sock := filepath.Join(munge, "socket")
	if err := s.daemon(exec.Command("munged", "--foreground", "--force", "--socket="+sock,
		"--key-file="+filepath.Join(munge, "key"), "--pid-file="+filepath.Join(munge, "pid"),
		"--log-file="+filepath.Join(munge, "log"), "--seed-file="+filepath.Join(munge, "seed"))); err != nil {
		return err
	}
	if err := pollFor(func() bool { _, err := os.Stat(sock); return err == nil }); err != nil {
		return fmt.Errorf("testcluster: munged's socket %s: %w", sock, err)
	}
	hostname, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	hostname, _, _ = strings.Cut(hostname, ".")
	port, err := freePort()
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `ClusterName=%s
SlurmctldHost=%s(%s)
SlurmctldPort=%d
SlurmdPort=6818
SrunPortRange=60001-63000
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%s
StateSaveLocation=%s
SlurmdSpoolDir=%s/spool-%%n
SlurmctldPidFile=%s/slurmctld.pid
SlurmdPidFile=%s/slurmd-%%n.pid
SlurmctldLogFile=%s/slurmctld.log
SlurmdLogFile=%s/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SlurmdTimeout=10
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
`, s.Hosts.tag, hostname, s.Hosts.BridgeAddr, port, sock, s.dir, s.dir, s.dir, s.dir, s.dir, s.dir)
	for i, name := range s.Hosts.Names {
		fmt.Fprintf(&b, "NodeName=%s NodeAddr=%s CPUs=2 State=UNKNOWN\n", name, s.Hosts.Addrs[i])
	}
	b.WriteString("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
	if err := os.WriteFile(s.Conf, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	// slurmd loads a cgroup plugin even with proctrack/linuxproc and
	// task/none, and its autodetection depends on the host: cgroup v1
	// hierarchies under a tmpfs fail it, and on cgroup v2 it takes
	// cgroup/v2, which wants a systemd scope for slurmstepd that three
	// slurmds on one host would share. So every host gets cgroup/v1 at an
	// empty directory of the cluster's: that plugin touches a controller
	// only for the plugins that ask for one (proctrack/cgroup,
	// task/cgroup), none here. Checked with Slurm 22.05 on a cgroup v1
	// host: slurmd starts and runs steps so, and also in a mount namespace
	// with cgroup2 mounted at /sys/fs/cgroup (where an empty cgroup.conf,
	// autodetection, makes slurmd exit: "Hybrid mode is not supported",
	// /proc/self/cgroup still listing v1 hierarchies). Not checked: a host
	// with cgroup v2 alone.
	cgroupDir := filepath.Join(s.dir, "cgroup")
	if err := os.Mkdir(cgroupDir, 0o755); err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	cgroup := "CgroupPlugin=cgroup/v1\nCgroupMountpoint=" + cgroupDir + "\n"
	if err := os.WriteFile(filepath.Join(s.dir, "cgroup.conf"), []byte(cgroup), 0o644); err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	if err := s.daemon(exec.Command("slurmctld", "-D", "-i")); err != nil {
		return err
	}
	for i, name := range s.Hosts.Names {
		if err := s.daemon(s.Hosts.Exec(context.Background(), i, "slurmd", "-D", "-N", name)); err != nil {
			return err
		}
	}
	var last string
	err = waitForWithin(slurmUp, func() bool {
		out, err := s.Output("sinfo", "-h", "-N", "-o", "%N %T")
		last = out
		return err == nil && strings.Count(out, " idle\n") == len(s.Hosts.Names)
	})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "slurmctld.log"))
		return fmt.Errorf("testcluster: slurm nodes not idle after %v: sinfo says %q; slurmctld.log ends:\n%s", slurmUp, last, tailOf(string(log), 20))
	}
	return nil
}

// daemon starts cmd with s.Env, its output to the cluster's directory,
// for stop to end. It has its own process group (a Ctrl-C on the terminal
// is the test's to handle) and dies with the test (SIGKILL when the test
// process ends; ip netns exec execs the daemon, which keeps it).
func (s *Slurm) daemon(cmd *exec.Cmd) error {
	cmd.Env = s.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(s.dir, filepath.Base(cmd.Args[len(cmd.Args)-1])+"-"+strconv.Itoa(len(s.procs))+".out"))
	if err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testcluster: starting %s: %w", cmd.Args[0], err)
	}
	s.procs = append(s.procs, cmd)
	return nil
}

// stop kills every process of the cluster: the hosts' (slurmd, its
// slurmstepds and whatever they left) and the root namespace's daemons.
func (s *Slurm) stop() {
	for i := range s.Hosts.Names {
		_ = s.Hosts.KillAll(i)
	}
	for _, p := range s.procs {
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		_ = p.Wait()
	}
	_ = os.RemoveAll(s.dir)
}

// freePort returns a TCP port free on this host at the time of the call.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		return 0, fmt.Errorf("testcluster: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pollFor polls ok every 50 ms for up to 10 seconds.
func pollFor(ok func() bool) error { return waitForWithin(10*time.Second, ok) }

func waitForWithin(limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %v", limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
