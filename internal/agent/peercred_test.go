package agent

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"log/slog"

	"github.com/gorun/gorun/internal/wire"
)

// foreignPeer is a rank of another user: it says hello on GORUN_SOCKET
// and prints what comes back, "welcome" or "closed".
func foreignPeer() int {
	c, err := net.Dial("unix", os.Getenv(wire.EnvSocket))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if err := wire.WriteSock(c, wire.SockHello, &wire.Hello{Version: wire.SockVersion, Pid: os.Getpid()}); err != nil {
		fmt.Println("closed") // refused before it could write
		return 0
	}
	typ, _, err := wire.ReadSock(c)
	switch {
	case err != nil:
		fmt.Println("closed")
	case typ == wire.SockWelcome:
		fmt.Println("welcome")
	default:
		fmt.Println("type", typ)
	}
	return 0
}

// lockedBuffer is a bytes.Buffer safe for the serving goroutines' logs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRankSocketPeerCredentials: beside the job directory's mode, the
// agent answers only a process of its own uid on a rank's socket, here
// one any user may connect to: one of the agent's user gets the Welcome
// (it carries the data key), one of another user (nobody, a child of the
// test binary run with SysProcAttr.Credential) gets the connection closed
// with no answer, and the refusal is logged.
func TestRankSocketPeerCredentials(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root, to run a child as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	s := testSockets(t)
	var logs lockedBuffer
	s.log = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	s.world, s.epoch = 2, 1
	s.table = twoRankTable(1).Encode()

	// The test binary and the socket, where nobody may reach them.
	// (Not t.TempDir, whose parent only root may enter.)
	dir, err := os.MkdirTemp("", "peercred-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "rank-1.sock")
	if err := s.listen(1, name); err != nil {
		t.Fatal(err)
	}
	// Any user may connect to it: the agent's uid check alone refuses.
	if err := os.Chmod(name, 0o777); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agent.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cred *syscall.Credential
		want string
	}{
		{"same user", nil, "welcome"},
		{"other user", &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, "closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), agenttestHelper+"=foreignpeer", wire.EnvSocket+"="+name)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: tc.cred}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Fatalf("child saw %q, want %q", got, tc.want)
			}
		})
	}
	want := fmt.Sprintf("refused a connection from uid %d", uid)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log:\n%s", want, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
