package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// The test binary plays a rank when agenttestHelper is set.
const agenttestHelper = "AGENTTEST_HELPER"

func TestMain(m *testing.M) {
	gortest.RunHelper(agenttestHelper, map[string]func() int{"epochwatch": epochWatch, "rankprobe": rankProbe, "rankstager": rankStager, "jobdirholder": jobDirHolder, "mpichuser": mpichUser, "mpichsweeper": mpichSweeper, "foreignpeer": foreignPeer})
	os.Exit(m.Run())
}

// epochWatch is a rank that enters a fence that cannot complete, and
// reports how a new epoch reaches it: the fence fails and the table is
// pushed.
func epochWatch() int {
	c, err := net.Dial("unix", os.Getenv(wire.EnvSocket))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	wire.WriteSock(c, wire.SockHello, &wire.Hello{Version: wire.SockVersion})
	_, b, err := wire.ReadSock(c)
	var w wire.Welcome
	if err != nil || wire.DecodeSock(b, &w) != nil {
		fmt.Println("welcome:", err)
		return 1
	}
	fmt.Printf("welcome epoch=%d master=%s:%d\n", w.Epoch, w.MasterAddr, w.MasterPort)
	wire.WriteSock(c, wire.SockFence, &wire.Fence{Epoch: w.Epoch, KV: map[string]string{"k": "v"}})
	fmt.Println("fence sent")
	for seen := 0; seen < 2; seen++ {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		typ, b, err := wire.ReadSock(c)
		if err != nil {
			fmt.Println("read:", err)
			return 1
		}
		switch typ {
		case wire.SockFenceDone:
			var f wire.Fence
			wire.DecodeSock(b, &f)
			fmt.Printf("fence failed: %s\n", f.Err)
		case wire.SockEpoch:
			var p wire.Welcome
			wire.DecodeSock(b, &p)
			t, err := wire.DecodeEpochTable(p.Table)
			fmt.Printf("pushed epoch=%d table=%d %v master=%s:%d\n", p.Epoch, t.Epoch, err, p.MasterAddr, p.MasterPort)
		default:
			fmt.Println("unexpected type", typ)
			return 1
		}
	}
	return 0
}

func TestNewEpochReachesRanks(t *testing.T) {
	const job = "epochtest"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, creds, dial := testControlPlane(t, ctx, job)
	subj := wire.JobSubjects(job)
	up := make(chan *nats.Msg, 1024)
	sub, _ := l.ChanSubscribe(subj.Up, up)
	defer sub.Unsubscribe()
	// Two hosts in the table, so that host 0's fence can never complete.
	hosts := []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}}
	rv, err := control.StartRendezvous(l.Conn, job, 0, hosts, &wire.JobSpec{
		Prog: os.Args[0], Env: []string{agenttestHelper + "=epochwatch"}, Dir: t.TempDir(),
		KillGrace: time.Second, HeartbeatInterval: time.Second, StdinRank: wire.NoStdin,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Close()
	agentErr := make(chan error, 1)
	go func() {
		agentErr <- Run(ctx, Config{Job: job, Host: 0, Name: "h0", Creds: creds, Dial: dial, Addr: "127.0.0.1", Logger: testLogger(t)})
	}()

	var out strings.Builder
	fenced := false // the agent has sent its host's fence up
	waitFor := func(what string) {
		t.Helper()
		done := func() bool {
			if what == "" {
				return fenced
			}
			return strings.Contains(out.String(), what)
		}
		for !done() {
			select {
			case m := <-up:
				switch _, kind, _ := subj.ParseUp(m.Subject); kind {
				case wire.UpKindOutput:
					_ = wire.DecodeOutputFrame(m.Data, 1, func(_ int, r wire.OutputRecord) { out.Write(r.Data) })
				case wire.UpKindFence:
					fenced = true
				}
			case err := <-agentErr:
				t.Fatalf("agent ended: %v\noutput:\n%s", err, out.String())
			case <-ctx.Done():
				t.Fatalf("no %q; output:\n%s", what, out.String())
			}
		}
	}
	waitFor("") // the rank is in the fence (a fence sent after the new epoch is refused instead)
	next := rv.Table()
	// The Welcome and the pushed Epoch carry their epoch's torchrun
	// rendezvous address in plain JSON: a new epoch's port differs.
	if next.MasterPort == 0 {
		t.Fatalf("epoch 0's table has no MASTER_PORT: %+v", next)
	}
	waitFor(fmt.Sprintf("welcome epoch=0 master=%s:%d\n", next.MasterAddr, next.MasterPort))
	next.Epoch = 1
	next.MasterAddr, next.MasterPort = "192.0.2.7", next.MasterPort%60000+1
	if err := l.Publish(subj.Epoch, next.Encode()); err != nil {
		t.Fatal(err)
	}
	waitFor(fmt.Sprintf("pushed epoch=1 table=1 <nil> master=192.0.2.7:%d\n", next.MasterPort))
	waitFor("fence failed: the epoch changed to 1\n")
	l.Publish(subj.Control, wire.Marshal(&wire.Control{Op: wire.OpExit}))
	if err := <-agentErr; err != nil {
		t.Fatalf("agent: %v", err)
	}
}
