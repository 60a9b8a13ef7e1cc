package main

import (
	"bytes"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/testcluster"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// helperCtlSpy is a rank that tries to take over the control plane with
// what it can see: the control-plane URL in its agent's argv, and every
// 32-byte hex string in its Welcome and environment, each tried as an
// nkey seed (the control plane's credential form). With TLS it skips
// certificate checks, as an attacker would: only authentication stands in
// its way. It prints one line per key: "spy: FIELD refused: ERR" or
// "spy: FIELD ADMITTED".
func helperCtlSpy() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "spy:", err); return 1 }
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(os.Getppid()) + "/cmdline")
	if err != nil {
		return fail(err)
	}
	url := ""
	args := strings.Split(string(cmdline), "\x00")
	for i, a := range args {
		if a == "--control" && i+1 < len(args) {
			url = args[i+1]
		}
	}
	if url == "" {
		return fail(fmt.Errorf("no --control in the agent's argv %q", args))
	}
	c, err := net.Dial("unix", os.Getenv(wire.EnvSocket))
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	if err := wire.WriteSock(c, wire.SockHello, &wire.Hello{Version: wire.SockVersion, Pid: os.Getpid()}); err != nil {
		return fail(err)
	}
	typ, b, err := wire.ReadSock(c)
	if err != nil || typ != wire.SockWelcome {
		return fail(fmt.Errorf("welcome: type %d, %v", typ, err))
	}
	var welcome map[string]any
	if err := json.Unmarshal(b, &welcome); err != nil {
		return fail(err)
	}
	keys := map[string][]byte{}
	for name, v := range welcome {
		if s, ok := v.(string); ok {
			if k, err := hex.DecodeString(s); err == nil && len(k) == 32 {
				keys["welcome."+name] = k
			}
		}
	}
	for _, e := range os.Environ() {
		name, v, _ := strings.Cut(e, "=")
		for _, m := range regexp.MustCompile(`[0-9a-fA-F]{64}`).FindAllString(v, -1) {
			k, _ := hex.DecodeString(m)
			keys["env."+name] = k
		}
	}
	names := make([]string, 0, len(keys))
	for n := range keys {
		names = append(names, n)
	}
	sort.Strings(names)
	scheme, _, _ := strings.Cut(url, "://")
	fmt.Println("job " + os.Getenv(wire.EnvJobID))
	fmt.Printf("spy: control plane %s\n", scheme)
	fmt.Printf("spy: welcome fields %s\n", strings.Join(sortedKeys(welcome), ","))
	for _, name := range names {
		kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, keys[name])
		if err != nil {
			return fail(err)
		}
		pub, _ := kp.PublicKey()
		opts := []nats.Option{nats.Nkey(pub, kp.Sign), nats.NoReconnect(), nats.Timeout(10 * time.Second)}
		if strings.HasPrefix(url, "tls://") {
			opts = append(opts, nats.Secure(&tls.Config{InsecureSkipVerify: true}))
		}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			fmt.Printf("spy: %s refused: %v\n", name, err)
			continue
		}
		fmt.Printf("spy: %s ADMITTED\n", name)
		// What an admitted rank could do: kill every rank of the job.
		_ = nc.Publish("gorun."+os.Getenv(wire.EnvJobID)+".control", wire.Marshal(&wire.Control{Op: wire.OpKill}))
		_ = nc.Flush()
		nc.Close()
	}
	return 0
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestRankCannotUseControlPlane: the Welcome a rank gets carries no
// control-plane credential, and nothing a rank can see admits it to the
// control plane (refused with an authorization error), over loopback
// (plaintext) and over a namespace bridge (TLS).
func TestRankCannotUseControlPlane(t *testing.T) {
	tests := []struct {
		name   string
		scheme string // of the control-plane URL
		args   func(t *testing.T) []string
	}{
		{"loopback", "nats", func(t *testing.T) []string {
			return []string{"-H", "fakehost1:2", "--bind", "127.0.0.1", "--rsh", fakeRsh(t, `exec "$@"`)}
		}},
		{"tls", "tls", func(t *testing.T) []string {
			hosts := testcluster.NetnsHosts(t, 2)
			hf := hosts.WriteHostfile(t, t.TempDir(), 1)
			return []string{"--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(tt.args(t), "-np", "2", os.Args[0])
			j := startJob(t, "ctlspy", nil, args...)
			res := j.wait(90 * time.Second) // no process of the job is left
			if res.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
			}
			checkNoJobFiles(t, j.jobID())
			if strings.Contains(res.stdout, "ADMITTED") {
				t.Fatalf("a rank was admitted to the control plane:\n%s", res.stdout)
			}
			refused := regexp.MustCompile(`(?m)^\[\d\] spy: (\S+) refused: (.*)$`).FindAllStringSubmatch(res.stdout, -1)
			if len(refused) < 2 { // the data-plane key, at each rank
				t.Fatalf("the ranks tried %d keys, want at least 2:\n%s", len(refused), res.stdout)
			}
			for _, m := range refused {
				if !strings.Contains(strings.ToLower(m[2]), "authorization violation") {
					t.Errorf("%s refused with %q, want an authorization violation", m[1], m[2])
				}
				if strings.HasPrefix(m[1], "env.") {
					t.Errorf("a key-like string in the rank's environment: %s", m[1])
				}
			}
			if n := strings.Count(res.stdout, "spy: control plane "+tt.scheme+"\n"); n != 2 {
				t.Errorf("%d ranks saw a %s:// control plane, want 2:\n%s", n, tt.scheme, res.stdout)
			}
			if !bytes.Contains([]byte(res.stdout), []byte("spy: welcome.data_key refused")) {
				t.Errorf("the Welcome has no data-plane key:\n%s", res.stdout)
			}
		})
	}
}

// TestAgentTakesOnlyItsOwnCredentials: an agent refuses a bare job secret
// (the launcher never sends one) and another host's credentials, and says
// nothing of what it read.
func TestAgentTakesOnlyItsOwnCredentials(t *testing.T) {
	s, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	other, err := jobkey.NewSealKey()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := jobkey.SealHostCredentials(s.HostCredentials(0, nil), "j1", other.PublicKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, line string
		slurm      bool
	}{
		{"the job secret", hex.EncodeToString(s[:]), false},
		{"another host's credentials", s.HostCredentials(1, nil).Encode(), false},
		// Under srun every agent reads every node's line: one sealed to
		// another node's key does not open.
		{"another node's sealed line", "0 " + sealed, true},
		{"credentials in the clear under srun", "0 " + s.HostCredentials(0, nil).Encode(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(gorunBin, "agent", "--job", "j1", "--host-index", "0", "--host-name", "h0", "--control", "nats://127.0.0.1:1")
			if tt.slurm {
				cmd = exec.Command(gorunBin, "agent", "--slurm", "--job", "j1", "--control", "nats://127.0.0.1:1")
				cmd.Env = append(os.Environ(), "SLURMD_NODENAME=h0")
			}
			cmd.Stdin = strings.NewReader(tt.line + "\n")
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, out)
			}
			if !strings.Contains(string(out), "credentials") {
				t.Errorf("the error does not say what was wrong: %s", out)
			}
			if hex64.Match(out) {
				t.Errorf("the agent printed a key: %s", out)
			}
		})
	}
}
