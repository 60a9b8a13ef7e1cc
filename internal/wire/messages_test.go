package wire_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

var (
	// tooLong is one byte past the limit on any string a decoder accepts.
	tooLong = strings.Repeat("x", wire.MaxStringLen+1)
	// longest is the longest string a decoder accepts.
	longest = strings.Repeat("y", wire.MaxStringLen)
)

func validRegister() wire.Register {
	return wire.Register{
		Version:    wire.Version,
		Job:        "job-7f3a",
		Host:       3,
		Name:       "node003",
		Addr:       "10.0.0.3",
		MasterPort: 29500,
		Pid:        4242,
	}
}

func TestDecodeRegisterRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		reg  *wire.Register
	}{
		{"typical", mutate(validRegister(), func(*wire.Register) {})},
		{"zero host and port", mutate(validRegister(), func(r *wire.Register) { r.Host, r.MasterPort = 0, 0 })},
		{"last host, last port", mutate(validRegister(), func(r *wire.Register) { r.Host, r.MasterPort = wire.MaxHosts-1, 65535 })},
		{"empty name and addr", mutate(validRegister(), func(r *wire.Register) { r.Name, r.Addr = "", "" })},
		{"longest name", mutate(validRegister(), func(r *wire.Register) { r.Name = longest })},
		{"ipv6 and unicode", mutate(validRegister(), func(r *wire.Register) { r.Name, r.Addr = "nœud-Ω<&>", "fe80::1%eth0" })},
		{"64-char job id", mutate(validRegister(), func(r *wire.Register) { r.Job = strings.Repeat("a", 64) })},
		{"master port pool", mutate(validRegister(), func(r *wire.Register) { r.MasterPorts = []int{29500, 1, 65535} })},
		{"pool of one", mutate(validRegister(), func(r *wire.Register) { r.MasterPorts = []int{29500} })},
		{"largest pool", mutate(validRegister(), func(r *wire.Register) {
			r.MasterPorts = nil
			for i := range wire.MaxMasterPorts {
				r.MasterPorts = append(r.MasterPorts, 29500+i)
			}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, tc.reg, wire.DecodeRegister) })
	}
}

func TestDecodeRegisterRejects(t *testing.T) {
	reg := func(f func(*wire.Register)) []byte { return wire.Marshal(mutate(validRegister(), f)) }
	testRejects(t, wire.DecodeRegister, []rejectCase{
		{"empty input", nil},
		{"null", []byte(`null`)},
		{"empty object", []byte(`{}`)},
		{"not json", []byte(`register me`)},
		{"array", []byte(`[1]`)},
		{"truncated", reg(func(*wire.Register) {})[:20]},
		{"version 0", reg(func(r *wire.Register) { r.Version = 0 })},
		{"version 2", reg(func(r *wire.Register) { r.Version = wire.Version + 1 })},
		{"empty job", reg(func(r *wire.Register) { r.Job = "" })},
		{"uppercase job", reg(func(r *wire.Register) { r.Job = "Job" })},
		{"wildcard job", reg(func(r *wire.Register) { r.Job = "job.>" })},
		{"65-char job", reg(func(r *wire.Register) { r.Job = strings.Repeat("a", 65) })},
		{"negative host", reg(func(r *wire.Register) { r.Host = -1 })},
		{"host past MaxHosts", reg(func(r *wire.Register) { r.Host = wire.MaxHosts })},
		{"negative port", reg(func(r *wire.Register) { r.MasterPort = -1 })},
		{"port 65536", reg(func(r *wire.Register) { r.MasterPort = 65536 })},
		{"empty master port pool", []byte(`{"v":1,"job":"j","host":0,"name":"","addr":"","mport":0,"mports":[],"pid":1}`)},
		{"pool not starting with the master port", reg(func(r *wire.Register) { r.MasterPorts = []int{29501, 29500} })},
		{"port 0 in the pool", reg(func(r *wire.Register) { r.MasterPort, r.MasterPorts = 0, []int{0, 29501} })},
		{"negative port in the pool", reg(func(r *wire.Register) { r.MasterPorts = []int{29500, -1} })},
		{"port 65536 in the pool", reg(func(r *wire.Register) { r.MasterPorts = []int{29500, 65536} })},
		{"a port twice in the pool", reg(func(r *wire.Register) { r.MasterPorts = []int{29500, 29501, 29500} })},
		{"pool past MaxMasterPorts", reg(func(r *wire.Register) {
			r.MasterPorts = nil
			for i := range wire.MaxMasterPorts + 1 {
				r.MasterPorts = append(r.MasterPorts, 29500+i)
			}
		})},
		{"pool as a number", []byte(`{"v":1,"job":"j","host":0,"name":"","addr":"","mport":5,"mports":5,"pid":1}`)},
		{"oversized name", reg(func(r *wire.Register) { r.Name = tooLong })},
		{"oversized addr", reg(func(r *wire.Register) { r.Addr = tooLong })},
		{"unknown field", []byte(`{"v":1,"job":"j","host":0,"name":"","addr":"","mport":0,"pid":1,"extra":true}`)},
		{"trailing object", append(reg(func(*wire.Register) {}), `{}`...)},
		{"trailing garbage", append(reg(func(*wire.Register) {}), ` x`...)},
		{"host as string", []byte(`{"v":1,"job":"j","host":"0"}`)},
		{"host as float", []byte(`{"v":1,"job":"j","host":1.5}`)},
		{"host overflows int", []byte(`{"v":1,"job":"j","host":99999999999999999999}`)},
	})
}

func validSpec() *wire.JobSpec {
	return &wire.JobSpec{
		Prog:              "/usr/bin/python3",
		Args:              []string{"train.py", "--lr=0.1", ""},
		Env:               []string{"NCCL_DEBUG=INFO", "EMPTY=", "EQ==x=y"},
		Dir:               "/scratch/run",
		KillGrace:         30 * time.Second,
		HeartbeatInterval: time.Second,
		OutputDelay:       50 * time.Millisecond,
	}
}

func TestDecodeRegisterReplyRoundTrip(t *testing.T) {
	spec := func(f func(*wire.JobSpec)) *wire.RegisterReply {
		s := validSpec()
		f(s)
		return &wire.RegisterReply{Spec: s}
	}
	tests := []struct {
		name  string
		reply *wire.RegisterReply
	}{
		{"typical", spec(func(*wire.JobSpec) {})},
		{"no args or env", spec(func(s *wire.JobSpec) { s.Args, s.Env, s.Dir = nil, nil, "" })},
		{"zero grace and delay", spec(func(s *wire.JobSpec) { s.KillGrace, s.OutputDelay = 0, 0 })},
		{"tiny heartbeat", spec(func(s *wire.JobSpec) { s.HeartbeatInterval = 1 })},
		{"MaxArgs args", spec(func(s *wire.JobSpec) { s.Args = make([]string, wire.MaxArgs) })},
		{"diff mode", spec(func(s *wire.JobSpec) {
			s.ProtectMode, s.DiffFold, s.BaseEvery, s.DiffCodec = "diff", wire.MaxDiffFold, wire.MaxBaseEvery, "topk:0.01"
		})},
		// The agent parses mode and codec: the decoder only bounds them.
		{"unknown mode and codec", spec(func(s *wire.JobSpec) {
			s.ProtectMode, s.DiffCodec = "delta", strings.Repeat("z", wire.MaxProtectString)
		})},
		{"error only", &wire.RegisterReply{Err: "wire: host 3 registered twice"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, tc.reply, wire.DecodeRegisterReply) })
	}
}

func TestDecodeRegisterReplyRejects(t *testing.T) {
	reply := func(f func(*wire.JobSpec)) []byte {
		s := validSpec()
		f(s)
		return wire.Marshal(&wire.RegisterReply{Spec: s})
	}
	testRejects(t, wire.DecodeRegisterReply, []rejectCase{
		{"empty input", nil},
		{"null", []byte(`null`)},
		{"missing spec", []byte(`{}`)},
		{"empty error and no spec", []byte(`{"err":""}`)},
		{"null spec", []byte(`{"spec":null}`)},
		{"empty program", reply(func(s *wire.JobSpec) { s.Prog = "" })},
		{"env without =", reply(func(s *wire.JobSpec) { s.Env = []string{"A=1", "NOVALUE"} })},
		{"env with empty key", reply(func(s *wire.JobSpec) { s.Env = []string{"=value"} })},
		{"env empty entry", reply(func(s *wire.JobSpec) { s.Env = []string{""} })},
		{"env long bad entry", reply(func(s *wire.JobSpec) { s.Env = []string{tooLong} })},
		{"too many args", reply(func(s *wire.JobSpec) { s.Args = make([]string, wire.MaxArgs+1) })},
		{"too many env", reply(func(s *wire.JobSpec) {
			s.Env = make([]string, wire.MaxArgs+1)
			for i := range s.Env {
				s.Env[i] = "A=1"
			}
		})},
		{"negative grace", reply(func(s *wire.JobSpec) { s.KillGrace = -time.Second })},
		{"zero heartbeat", reply(func(s *wire.JobSpec) { s.HeartbeatInterval = 0 })},
		{"negative heartbeat", reply(func(s *wire.JobSpec) { s.HeartbeatInterval = -1 })},
		{"negative output delay", reply(func(s *wire.JobSpec) { s.OutputDelay = -1 })},
		{"duration as string", []byte(`{"spec":{"prog":"p","hb":"1s"}}`)},
		{"unknown top-level field", []byte(`{"spec":{"prog":"p","hb":1},"extra":1}`)},
		{"unknown spec field", []byte(`{"spec":{"prog":"p","hb":1,"user":"root"}}`)},
		{"args not strings", []byte(`{"spec":{"prog":"p","hb":1,"args":[1]}}`)},
		{"trailing data", append(reply(func(*wire.JobSpec) {}), `]`...)},
		{"two messages", append(reply(func(*wire.JobSpec) {}), reply(func(*wire.JobSpec) {})...)},
		{"error and spec", wire.Marshal(&wire.RegisterReply{Err: "no", Spec: validSpec()})},
		{"NUL in an argument", reply(func(s *wire.JobSpec) { s.Args = []string{"a\x00b"} })},
		{"NUL in the program", reply(func(s *wire.JobSpec) { s.Prog = "p\x00" })},
		{"NUL in env", reply(func(s *wire.JobSpec) { s.Env = []string{"A=1\x00"} })},
		{"arguments too large", reply(func(s *wire.JobSpec) { s.Args = []string{strings.Repeat("a", wire.MaxArgBytes)} })},
		{"long error", wire.Marshal(&wire.RegisterReply{Err: tooLong})},
		{"negative diff fold", reply(func(s *wire.JobSpec) { s.ProtectMode, s.DiffFold = "diff", -1 })},
		{"diff fold too deep", reply(func(s *wire.JobSpec) { s.ProtectMode, s.DiffFold = "diff", wire.MaxDiffFold+1 })},
		{"negative base-every", reply(func(s *wire.JobSpec) { s.ProtectMode, s.BaseEvery = "diff", -1 })},
		{"base-every too long", reply(func(s *wire.JobSpec) { s.ProtectMode, s.BaseEvery = "diff", wire.MaxBaseEvery+1 })},
		{"long diff codec", reply(func(s *wire.JobSpec) {
			s.ProtectMode, s.DiffCodec = "diff", strings.Repeat("z", wire.MaxProtectString+1)
		})},
		{"long protect mode", reply(func(s *wire.JobSpec) { s.ProtectMode = strings.Repeat("d", wire.MaxProtectString+1) })},
		{"diff codec not a string", []byte(`{"spec":{"prog":"p","hb":1,"pmode":"diff","dcodec":8}}`)},
	})
}

func validEvent() wire.Event {
	return wire.Event{Kind: wire.EventExited, Host: 2, Rank: 17, Pid: 999, Code: 3}
}

func TestDecodeEventRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		ev   *wire.Event
	}{
		{"exited", mutate(validEvent(), func(*wire.Event) {})},
		{"started", mutate(validEvent(), func(e *wire.Event) { e.Kind, e.Code = wire.EventStarted, 0 })},
		{"signalled and stopped", mutate(validEvent(), func(e *wire.Event) { e.Code, e.Signal, e.Stopped = -1, 15, true })},
		{"largest signal", mutate(validEvent(), func(e *wire.Event) { e.Code, e.Signal = -1, 128 })},
		{"agent error without rank", mutate(validEvent(), func(e *wire.Event) {
			e.Kind, e.Rank, e.Pid, e.Code, e.Msg = wire.EventAgentError, -1, 0, 0, "cannot exec: no such file"
		})},
		{"agent done", &wire.Event{Kind: wire.EventAgentDone, Host: wire.MaxHosts - 1, Rank: -1}},
		{"last rank", mutate(validEvent(), func(e *wire.Event) { e.Rank = wire.MaxWorld - 1 })},
		{"longest message", mutate(validEvent(), func(e *wire.Event) { e.Msg = longest })},
		{"epoch", &wire.Event{Kind: wire.EventEpoch, Host: 3, Rank: -1, Epoch: 7}},
		{"replication failed", &wire.Event{Kind: wire.EventReplFailed, Host: 3, Rank: -1, Peer: 0, Msg: "connection refused"}},
		{"peer lost", &wire.Event{Kind: wire.EventPeerLost, Host: 3, Rank: 6, Peers: []int{0, 7}}},
		{"abort", &wire.Event{Kind: wire.EventAbort, Host: 1, Rank: 1, Gen: 2, Code: 7, Msg: "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1"}},
		{"abort with code 0", &wire.Event{Kind: wire.EventAbort, Host: 0, Rank: wire.MaxWorld - 1}},
		{"abort with code 255", &wire.Event{Kind: wire.EventAbort, Host: 0, Rank: 0, Code: 255}},
		{"exited with corrupt copies", mutate(validEvent(), func(e *wire.Event) {
			e.Corrupt = &wire.CorruptCopies{Step: 16, Holders: []int{e.Rank + 1, wire.MaxWorld - 1}}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, tc.ev, wire.DecodeEvent) })
	}
}

func TestDecodeEventRejects(t *testing.T) {
	ev := func(f func(*wire.Event)) []byte { return wire.Marshal(mutate(validEvent(), f)) }
	testRejects(t, wire.DecodeEvent, []rejectCase{
		{"empty input", nil},
		{"null", []byte(`null`)},
		{"empty object", []byte(`{}`)},
		{"unknown kind", ev(func(e *wire.Event) { e.Kind = "crashed" })},
		{"kind wrong case", ev(func(e *wire.Event) { e.Kind = "Started" })},
		{"long unknown kind", ev(func(e *wire.Event) { e.Kind = wire.EventKind(tooLong) })},
		{"negative host", ev(func(e *wire.Event) { e.Host = -1 })},
		{"host past MaxHosts", ev(func(e *wire.Event) { e.Host = wire.MaxHosts })},
		{"rank -2", ev(func(e *wire.Event) { e.Rank = -2 })},
		{"rank past MaxWorld", ev(func(e *wire.Event) { e.Rank = wire.MaxWorld })},
		{"negative signal", ev(func(e *wire.Event) { e.Signal = -1 })},
		{"signal 129", ev(func(e *wire.Event) { e.Signal = 129 })},
		{"oversized message", ev(func(e *wire.Event) { e.Msg = tooLong })},
		{"unknown field", []byte(`{"k":"started","h":0,"r":0,"code":0,"core":true}`)},
		{"kind not string", []byte(`{"k":1,"h":0,"r":0}`)},
		{"stopped not bool", []byte(`{"k":"exited","h":0,"r":0,"stopped":"yes"}`)},
		{"trailing data", append(ev(func(*wire.Event) {}), `,`...)},
		{"replication to itself", ev(func(e *wire.Event) { e.Kind, e.Peer = wire.EventReplFailed, e.Host })},
		{"replication to a negative host", ev(func(e *wire.Event) { e.Kind, e.Peer = wire.EventReplFailed, -1 })},
		{"peer lost without peers", ev(func(e *wire.Event) { e.Kind = wire.EventPeerLost })},
		{"peer lost naming itself", ev(func(e *wire.Event) { e.Kind, e.Peers = wire.EventPeerLost, []int{e.Rank} })},
		{"peer lost past MaxWorld", ev(func(e *wire.Event) { e.Kind, e.Peers = wire.EventPeerLost, []int{wire.MaxWorld} })},
		{"peer lost of no rank", ev(func(e *wire.Event) { e.Kind, e.Rank, e.Peers = wire.EventPeerLost, -1, []int{1} })},
		{"peers on an exit", ev(func(e *wire.Event) { e.Peers = []int{1} })},
		{"abort of no rank", ev(func(e *wire.Event) { e.Kind, e.Rank, e.Code, e.Signal = wire.EventAbort, -1, 7, 0 })},
		{"abort with a negative code", ev(func(e *wire.Event) { e.Kind, e.Code, e.Signal = wire.EventAbort, -1, 0 })},
		{"abort with code 256", ev(func(e *wire.Event) { e.Kind, e.Code, e.Signal = wire.EventAbort, 256, 0 })},
		{"abort by a signal", ev(func(e *wire.Event) { e.Kind, e.Code, e.Signal = wire.EventAbort, 7, 9 })},
		{"abort stopped", ev(func(e *wire.Event) { e.Kind, e.Code, e.Signal, e.Stopped = wire.EventAbort, 7, 0, true })},
		{"corrupt copies on a start", ev(func(e *wire.Event) {
			e.Kind, e.Code, e.Corrupt = wire.EventStarted, 0, &wire.CorruptCopies{Step: 1, Holders: []int{e.Rank + 1}}
		})},
		{"corrupt copies of no holder", ev(func(e *wire.Event) { e.Corrupt = &wire.CorruptCopies{Step: 1} })},
		{"corrupt copies of a negative step", ev(func(e *wire.Event) { e.Corrupt = &wire.CorruptCopies{Step: -1, Holders: []int{e.Rank + 1}} })},
		{"corrupt copy at the rank itself", ev(func(e *wire.Event) { e.Corrupt = &wire.CorruptCopies{Step: 1, Holders: []int{e.Rank}} })},
		{"corrupt copy past MaxWorld", ev(func(e *wire.Event) { e.Corrupt = &wire.CorruptCopies{Step: 1, Holders: []int{wire.MaxWorld}} })},
		{"corrupt copy at a negative rank", ev(func(e *wire.Event) { e.Corrupt = &wire.CorruptCopies{Step: 1, Holders: []int{-1}} })},
		// The launcher indexes its rank tables with a rank event's rank.
		{"exit of no rank", ev(func(e *wire.Event) { e.Kind, e.Rank = wire.EventExited, -1 })},
		{"start of no rank", ev(func(e *wire.Event) { e.Kind, e.Rank = wire.EventStarted, -1 })},
	})
}

func TestEventExitStatus(t *testing.T) {
	tests := []struct {
		ev   wire.Event
		want int
	}{
		{wire.Event{Code: 0}, 0},
		{wire.Event{Code: 3}, 3},
		{wire.Event{Code: -1, Signal: 9}, 137},
		{wire.Event{Code: -1, Signal: 15}, 143},
	}
	for _, tc := range tests {
		if got := tc.ev.ExitStatus(); got != tc.want {
			t.Errorf("%+v.ExitStatus() = %d, want %d", tc.ev, got, tc.want)
		}
	}
}

func TestDecodeControlRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		c    *wire.Control
	}{
		{"signal", &wire.Control{Op: wire.OpSignal, Signal: 10}},
		{"stop", &wire.Control{Op: wire.OpStop, Signal: 15, Grace: 30 * time.Second}},
		{"stop signal 1", &wire.Control{Op: wire.OpStop, Signal: 1}},
		{"signal 64", &wire.Control{Op: wire.OpSignal, Signal: 64}},
		{"kill", &wire.Control{Op: wire.OpKill}},
		{"exit", &wire.Control{Op: wire.OpExit}},
		{"exit with the durable tier's last D and X", &wire.Control{Op: wire.OpExit, D: step(36), X: step(40)}},
		{"exit with X alone", &wire.Control{Op: wire.OpExit, X: step(0)}},
		{"probe", &wire.Control{Op: wire.OpProbe, Host: 7}},
		{"probe of host 0", &wire.Control{Op: wire.OpProbe}},
		{"restart from disk", &wire.Control{Op: wire.OpRestart, Gen: 2, Epoch: 2, G: 12, Disk: true}},
		{"reach", &wire.Control{Op: wire.OpReach, Epoch: 2, G: 12, Ranks: []int{3, 1, 2, 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, tc.c, wire.DecodeControl) })
	}
}

func TestDecodeControlRejects(t *testing.T) {
	ctl := func(c wire.Control) []byte { return wire.Marshal(&c) }
	testRejects(t, wire.DecodeControl, []rejectCase{
		{"empty input", nil},
		{"null", []byte(`null`)},
		{"empty object", []byte(`{}`)},
		{"unknown op", ctl(wire.Control{Op: "restart"})},
		{"op wrong case", ctl(wire.Control{Op: "KILL"})},
		{"signal without signal", ctl(wire.Control{Op: wire.OpSignal})},
		{"stop without signal", ctl(wire.Control{Op: wire.OpStop, Grace: time.Second})},
		{"negative signal", ctl(wire.Control{Op: wire.OpSignal, Signal: -9})},
		{"signal 65", ctl(wire.Control{Op: wire.OpStop, Signal: 65})},
		{"negative grace", ctl(wire.Control{Op: wire.OpStop, Signal: 15, Grace: -1})},
		{"negative grace on kill", ctl(wire.Control{Op: wire.OpKill, Grace: -time.Second})},
		{"unknown field", []byte(`{"op":"kill","force":true}`)},
		{"grace as string", []byte(`{"op":"stop","sig":15,"grace":"5s"}`)},
		{"trailing data", []byte(`{"op":"kill"} {"op":"exit"}`)},
		{"kill with a signal", []byte(`{"op":"kill","sig":-7}`)},
		{"exit with a signal", []byte(`{"op":"exit","sig":9}`)},
		{"probe of a negative host", ctl(wire.Control{Op: wire.OpProbe, Host: -1})},
		{"probe past MaxHosts", ctl(wire.Control{Op: wire.OpProbe, Host: wire.MaxHosts})},
		{"probe with a signal", ctl(wire.Control{Op: wire.OpProbe, Host: 1, Signal: 9})},
		{"kill naming a host", ctl(wire.Control{Op: wire.OpKill, Host: 1})},
		{"reach without ranks", ctl(wire.Control{Op: wire.OpReach, Epoch: 1, G: 4})},
		{"reach from a negative step", ctl(wire.Control{Op: wire.OpReach, Epoch: 1, G: -1, Ranks: []int{0}})},
		{"reach to a host past MaxHosts", ctl(wire.Control{Op: wire.OpReach, Epoch: 1, G: 4, Ranks: []int{0, wire.MaxHosts}})},
		{"reach to a negative host", ctl(wire.Control{Op: wire.OpReach, Epoch: 1, G: 4, Ranks: []int{-1}})},
		{"reach with a signal", ctl(wire.Control{Op: wire.OpReach, Epoch: 1, G: 4, Ranks: []int{0}, Signal: 9})},
		{"kill from disk", ctl(wire.Control{Op: wire.OpKill, Disk: true})},
		{"exit with D after X", ctl(wire.Control{Op: wire.OpExit, D: step(40), X: step(36)})},
		{"exit with a negative D", []byte(`{"op":"exit","d":-1}`)},
		{"exit with X past MaxStep", ctl(wire.Control{Op: wire.OpExit, X: step(wire.MaxStep + 1)})},
		{"kill with D", ctl(wire.Control{Op: wire.OpKill, D: step(4)})},
		{"restart with X", ctl(wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: 4, X: step(4)})},
		{"restart with ranks", ctl(wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: 4, Ranks: []int{0}})},
	})
}

func TestDecodeHeartbeat(t *testing.T) {
	for _, hb := range []*wire.Heartbeat{
		{Host: 0, Seq: 1},
		{Host: wire.MaxHosts - 1, Seq: ^uint64(0)},
	} {
		roundTrip(t, hb, wire.DecodeHeartbeat)
	}
	testRejects(t, wire.DecodeHeartbeat, []rejectCase{
		{"empty input", nil},
		{"negative host", []byte(`{"h":-1,"s":1}`)},
		{"host past MaxHosts", wire.Marshal(&wire.Heartbeat{Host: wire.MaxHosts})},
		{"negative seq", []byte(`{"h":0,"s":-1}`)},
		{"unknown field", []byte(`{"h":0,"s":1,"t":5}`)},
		{"trailing data", []byte(`{"h":0,"s":1}x`)},
		{"not an object", []byte(`"hb"`)},
		{"null", []byte(`null`)},
		{"array", []byte(`[]`)},
	})
}

// TestDecodeErrorsAreMalformed checks the error of every JSON decoder on
// input that is not JSON at all, which fails inside encoding/json.
func TestDecodeErrorsAreMalformed(t *testing.T) {
	decoders := map[string]func([]byte) error{
		"Register":      func(b []byte) error { _, err := wire.DecodeRegister(b); return err },
		"RegisterReply": func(b []byte) error { _, err := wire.DecodeRegisterReply(b); return err },
		"Event":         func(b []byte) error { _, err := wire.DecodeEvent(b); return err },
		"Control":       func(b []byte) error { _, err := wire.DecodeControl(b); return err },
		"Heartbeat":     func(b []byte) error { _, err := wire.DecodeHeartbeat(b); return err },
	}
	inputs := []string{"", " ", "{", "}", "\x00", "\xff\xfe", `{"`, `{"k":`, strings.Repeat("[", 20000)}
	for name, dec := range decoders {
		for _, in := range inputs {
			err := dec([]byte(in))
			if !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("Decode%s(%s) = %v, want ErrMalformed", name, short([]byte(in)), err)
			}
		}
	}
}

func TestMarshalPanicsOnUnencodable(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Marshal of a channel did not panic")
		}
	}()
	wire.Marshal(make(chan int))
}

// TestDecodeProgressCodedBase checks RankProgress.Base and GlobalStep.H
// (diff mode under erasure coding): a coded base is a replicated step
// (its differentials after it are at the holders too) and H is at most G;
// 0, their value in every other mode, goes with any step.
func TestDecodeProgressCodedBase(t *testing.T) {
	progress := func(c, p, b int64) []byte {
		return wire.Marshal(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: c, Replicated: p, Base: b}}})
	}
	for _, tc := range []struct {
		name    string
		c, p, b int64
		ok      bool
	}{
		{"no base yet", 7, 6, -1, true},
		{"base below replicated", 17, 16, 8, true},
		{"base at committed", 8, 8, 8, true},
		{"other modes: 0 before any commit", -1, -1, 0, true},
		{"other modes: 0", 9, 9, 0, true},
		{"base past committed", 7, 6, 8, false},
		{"base past replicated", 9, 6, 8, false},
		{"base with nothing replicated", 9, -1, 8, false},
		{"base without a commit", -1, -1, 1, false},
		{"base below -1", 7, 6, -2, false},
	} {
		t.Run("progress/"+tc.name, func(t *testing.T) {
			u, err := wire.DecodeUpProgress(progress(tc.c, tc.p, tc.b))
			switch {
			case tc.ok && err != nil:
				t.Fatalf("DecodeUpProgress: %v", err)
			case tc.ok && u.Ranks[0].Base != tc.b:
				t.Fatalf("Base = %d, want %d", u.Ranks[0].Base, tc.b)
			case !tc.ok && !errors.Is(err, wire.ErrMalformed):
				t.Fatalf("DecodeUpProgress = %+v, %v; want ErrMalformed", u, err)
			}
		})
	}
	for _, tc := range []struct {
		name string
		g, h int64
		ok   bool
	}{
		{"no base yet", 5, -1, true},
		{"H below G", 17, 16, true},
		{"H at G", 16, 16, true},
		{"nothing protected, no base", -1, -1, true},
		{"other modes", 5, 0, true},
		{"other modes, nothing protected", -1, 0, true},
		{"H past G", 5, 6, false},
		{"H without G", -1, 1, false},
		{"H below -1", 5, -2, false},
	} {
		t.Run("global/"+tc.name, func(t *testing.T) {
			g, err := wire.DecodeGlobalStep(wire.Marshal(&wire.GlobalStep{Gen: 1, G: tc.g, H: tc.h}))
			switch {
			case tc.ok && err != nil:
				t.Fatalf("DecodeGlobalStep: %v", err)
			case tc.ok && (g.G != tc.g || g.H != tc.h):
				t.Fatalf("decoded %+v, want G %d, H %d", g, tc.g, tc.h)
			case !tc.ok && !errors.Is(err, wire.ErrMalformed):
				t.Fatalf("DecodeGlobalStep = %+v, %v; want ErrMalformed", g, err)
			}
		})
	}
}

// step returns a pointer to v.
func step(v int64) *int64 { return &v }

// TestRegisterMasterPortPool: a malformed pool is refused with an error
// that says what is wrong with it, and MasterPortOf takes a pool's ports
// in turn (the one MasterPort without a pool).
func TestRegisterMasterPortPool(t *testing.T) {
	bad := []struct {
		pool []int
		want string
	}{
		{[]int{29501, 29500}, "starts with 29501, the master port is 29500"},
		{[]int{29500, 70000}, "port 70000 out of range"},
		{[]int{29500, 29501, 29501}, "port 29501 twice"},
		{make([]int, wire.MaxMasterPorts+1), "17 master ports, at most 16"},
	}
	for _, tc := range bad {
		_, err := wire.DecodeRegister(wire.Marshal(mutate(validRegister(), func(r *wire.Register) { r.MasterPorts = tc.pool })))
		if !errors.Is(err, wire.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pool %v: error %v, want one saying %q", tc.pool, err, tc.want)
		}
	}
	pooled := &wire.Register{MasterPort: 10, MasterPorts: []int{10, 11, 12}}
	single := &wire.Register{MasterPort: 10}
	for turn, want := range []int{10, 11, 12, 10, 11} {
		if got := wire.MasterPortOf(pooled, uint64(turn)); got != want {
			t.Errorf("MasterPortOf(pool, %d) = %d, want %d", turn, got, want)
		}
		if got := wire.MasterPortOf(single, uint64(turn)); got != 10 {
			t.Errorf("MasterPortOf(no pool, %d) = %d, want 10", turn, got)
		}
	}
}
