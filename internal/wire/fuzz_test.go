package wire_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// fuzzJSON fuzzes a JSON decoder: it must never panic, must fail only with
// ErrMalformed, and whatever it accepts must pass check and survive
// Marshal → decode unchanged.
func fuzzJSON[T any](f *testing.F, decode func([]byte) (*T, error), check func(*testing.T, *T), seeds ...[]byte) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decode(b)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("error %q does not wrap ErrMalformed", err)
			}
			if v != nil {
				t.Fatalf("value %+v returned with error %v", v, err)
			}
			return
		}
		check(t, v)
		b2 := wire.Marshal(v)
		v2, err := decode(b2)
		if err != nil {
			t.Fatalf("accepted %q, but its re-encoding %q fails: %v", b, b2, err)
		}
		if !reflect.DeepEqual(v, v2) {
			t.Fatalf("re-encoding changes the value:\n first %+v\nsecond %+v", v, v2)
		}
	})
}

func FuzzDecodeRegister(f *testing.F) {
	r := validRegister()
	fuzzJSON(f, wire.DecodeRegister, func(t *testing.T, r *wire.Register) {
		if r.Version != wire.Version || !wire.ValidJobID(r.Job) ||
			r.Host < 0 || r.Host >= wire.MaxHosts || r.MasterPort < 0 || r.MasterPort > 65535 ||
			len(r.Name) > wire.MaxStringLen || len(r.Addr) > wire.MaxStringLen {
			t.Fatalf("accepted invalid %+v", r)
		}
		if r.MasterPorts != nil {
			if len(r.MasterPorts) > wire.MaxMasterPorts || r.MasterPorts[0] != r.MasterPort {
				t.Fatalf("accepted invalid master port pool %v (master port %d)", r.MasterPorts, r.MasterPort)
			}
			for i, p := range r.MasterPorts {
				if p < 1 || p > 65535 || slices.Contains(r.MasterPorts[:i], p) {
					t.Fatalf("accepted invalid master port pool %v", r.MasterPorts)
				}
			}
		}
	},
		wire.Marshal(&r),
		wire.Marshal(mutate(r, func(r *wire.Register) { r.MasterPorts = []int{r.MasterPort, 29501, 29502, 29503} })),
		[]byte(`{"v":1,"job":"a","host":0,"name":"","addr":"","mport":7,"mports":[7,7],"pid":0}`),
		[]byte(`{"v":1,"job":"a","host":0,"name":"","addr":"","mport":7,"mports":[],"pid":0}`),
		wire.Marshal(mutate(r, func(r *wire.Register) { r.Name, r.Addr = "", "::1" })),
		[]byte(`{"v":1,"job":"a","host":0,"name":"","addr":"","mport":0,"pid":0}`),
		[]byte(`{"V":1,"JOB":"a","Host":1048575}`),
		[]byte(`{"v":1,"job":"a","name":"\u00e9\ud800"}`),
		[]byte(`{"v":2,"job":"a"}`),
		[]byte(`{"v":1,"job":"a"} {}`),
	)
}

func FuzzDecodeRegisterReply(f *testing.F) {
	fuzzJSON(f, wire.DecodeRegisterReply, func(t *testing.T, r *wire.RegisterReply) {
		if r.Err != "" {
			return
		}
		s := r.Spec
		if s == nil || s.Prog == "" || len(s.Args) > wire.MaxArgs || len(s.Env) > wire.MaxArgs ||
			s.KillGrace < 0 || s.HeartbeatInterval <= 0 || s.OutputDelay < 0 ||
			s.DiffFold < 0 || s.DiffFold > wire.MaxDiffFold || s.BaseEvery < 0 || int64(s.BaseEvery) > wire.MaxBaseEvery ||
			len(s.ProtectMode) > wire.MaxProtectString || len(s.DiffCodec) > wire.MaxProtectString {
			t.Fatalf("accepted invalid %+v", s)
		}
		if s.CkptDir == "" && (s.CkptEvery != 0 || s.CkptConcurrency != 0 || s.CkptOverhead != 0 || s.DiffBatch != 0 || s.Resume) ||
			s.CkptDir != "" && (s.CkptDir[0] != '/' || s.CkptEvery < 1 || s.CkptConcurrency < 0 || s.CkptConcurrency > wire.MaxCkptConcurrency ||
				!(s.CkptOverhead > 0 && s.CkptOverhead < 1) || s.DiffBatch < 0 || s.DiffBatch > wire.MaxDiffBatch) {
			t.Fatalf("accepted invalid durable settings %+v", s)
		}
		for _, e := range s.Env {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
				t.Fatalf("accepted env entry %q", e)
			}
		}
	},
		wire.Marshal(&wire.RegisterReply{Spec: validSpec()}),
		wire.Marshal(&wire.RegisterReply{Err: "host registered twice"}),
		wire.Marshal(&wire.RegisterReply{Spec: &wire.JobSpec{Prog: "p", HeartbeatInterval: time.Second}}),
		[]byte(`{"spec":{"prog":"p","args":[],"env":["A=1","B="],"dir":"/","grace":0,"hb":1,"odelay":0}}`),
		[]byte(`{"spec":{"prog":"p","hb":1,"env":["=x"]}}`),
		[]byte(`{"err":"","spec":null}`),
		[]byte(`{"spec":{"prog":"p","hb":1,"pmode":"diff","dfold":16,"bevery":100,"dcodec":"int8:256"}}`),
		[]byte(`{"spec":{"prog":"p","hb":1,"cdir":"/c","cevery":10,"cconc":2,"cover":0.03,"dbatch":5,"resume":true}}`),
		[]byte(`{"spec":{"prog":"p","hb":1,"cdir":"c","cevery":10,"cover":0.03}}`),
		[]byte(`{"spec":{"prog":"p","hb":1,"cevery":10}}`),
	)
}

func FuzzDecodeEvent(f *testing.F) {
	e := validEvent()
	fuzzJSON(f, wire.DecodeEvent, func(t *testing.T, e *wire.Event) {
		switch e.Kind {
		case wire.EventStarted, wire.EventExited, wire.EventAgentError, wire.EventAgentDone:
			if e.GPU != nil {
				t.Fatalf("accepted a GPU report in a %s event", e.Kind)
			}
		case wire.EventAbort:
			if e.Rank < 0 || e.Code < 0 || e.Code > 255 || e.Signal != 0 || e.Stopped || e.GPU != nil || e.Corrupt != nil || len(e.Peers) > 0 {
				t.Fatalf("accepted invalid abort %+v", e)
			}
		case wire.EventEpoch:
		case wire.EventReplFailed:
			if e.Peer < 0 || e.Peer >= wire.MaxHosts || e.Peer == e.Host {
				t.Fatalf("accepted replication from host %d to host %d", e.Host, e.Peer)
			}
		case wire.EventPeerLost:
			if e.Rank < 0 || len(e.Peers) == 0 || len(e.Peers) > wire.MaxPeers {
				t.Fatalf("accepted rank %d losing peers %v", e.Rank, e.Peers)
			}
			for _, p := range e.Peers {
				if p < 0 || p >= wire.MaxWorld || p == e.Rank {
					t.Fatalf("accepted lost peer %d of rank %d", p, e.Rank)
				}
			}
		case wire.EventGPU:
			g := e.GPU
			if g == nil || g.Index < 0 || g.Index >= wire.MaxGPUs || (g.Class != wire.GPUTransient && g.Class != wire.GPUPermanent && g.Class != wire.GPUUnknown) {
				t.Fatalf("accepted invalid GPU report %+v", g)
			}
			for _, r := range g.Ranks {
				if r < 0 || r >= wire.MaxWorld {
					t.Fatalf("accepted GPU rank %d", r)
				}
			}
		default:
			t.Fatalf("accepted kind %q", e.Kind)
		}
		if e.Host < 0 || e.Host >= wire.MaxHosts || e.Rank < -1 || e.Rank >= wire.MaxWorld ||
			e.Signal < 0 || e.Signal > 128 || len(e.Msg) > wire.MaxStringLen {
			t.Fatalf("accepted invalid %+v", e)
		}
		if st := e.ExitStatus(); e.Signal > 0 && (st <= 128 || st > 256) {
			t.Fatalf("ExitStatus() = %d for signal %d", st, e.Signal)
		}
	},
		wire.Marshal(&e),
		wire.Marshal(&wire.Event{Kind: wire.EventAgentError, Rank: -1, Msg: "no such file"}),
		// Valid kinds the check once took for invalid ones.
		wire.Marshal(&wire.Event{Kind: wire.EventEpoch, Host: 1, Rank: -1, Epoch: 3}),
		wire.Marshal(&wire.Event{Kind: wire.EventReplFailed, Host: 1, Rank: -1, Peer: 0}),
		wire.Marshal(&wire.Event{Kind: wire.EventPeerLost, Host: 1, Rank: 2, Peers: []int{3}}),
		wire.Marshal(&wire.Event{Kind: wire.EventGPU, Host: 1, Rank: -1, Msg: "XID 79: GPU has fallen off the bus",
			GPU: &wire.GPUReport{Index: 1, UUID: "GPU-1", Kind: "xid", XID: 79, Class: wire.GPUPermanent, Ranks: []int{1, 3}}}),
		wire.Marshal(&wire.Event{Kind: wire.EventExited, Host: 1, Rank: 2, Code: -1, Signal: 9, Stopped: true}),
		wire.Marshal(&wire.Event{Kind: wire.EventAbort, Host: 1, Rank: 1, Gen: 3, Code: 7, Msg: "called MPI_Abort"}),
		[]byte(`{"k":"agent-done","h":0,"r":-1}`),
		[]byte(`{"k":"started","h":0,"r":0,"pid":1,"code":0,"sig":0,"stopped":false,"msg":""}`),
		[]byte(`{"k":"bogus"}`),
	)
}

func FuzzDecodeControl(f *testing.F) {
	fuzzJSON(f, wire.DecodeControl, func(t *testing.T, c *wire.Control) {
		switch c.Op {
		case wire.OpSignal, wire.OpStop:
			if c.Signal < 1 || c.Signal > 64 {
				t.Fatalf("accepted %+v", c)
			}
		case wire.OpKill, wire.OpExit:
		case wire.OpRestart:
			if c.Gen == 0 || c.G < -1 || c.G > wire.MaxStep {
				t.Fatalf("accepted %+v", c)
			}
		default:
			t.Fatalf("accepted op %q", c.Op)
		}
		if c.Grace < 0 {
			t.Fatalf("accepted grace %v", c.Grace)
		}
		if (c.D != nil || c.X != nil) && c.Op != wire.OpExit ||
			c.D != nil && (*c.D < 0 || *c.D > wire.MaxStep) || c.X != nil && (*c.X < 0 || *c.X > wire.MaxStep || c.D != nil && *c.D > *c.X) {
			t.Fatalf("accepted durable steps %v, %v with %+v", c.D, c.X, c)
		}
	},
		wire.Marshal(&wire.Control{Op: wire.OpSignal, Signal: 10}),
		wire.Marshal(&wire.Control{Op: wire.OpStop, Signal: 15, Grace: 10 * time.Second}),
		wire.Marshal(&wire.Control{Op: wire.OpKill}),
		wire.Marshal(&wire.Control{Op: wire.OpExit}),
		[]byte(`{"op":"exit","d":36,"x":40}`),
		wire.Marshal(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: 41}),
		[]byte(`{"op":"stop","sig":65}`),
		[]byte(`{"op":"restart","gen":0,"g":3}`),
	)
}

func FuzzDecodeUpProgress(f *testing.F) {
	fuzzJSON(f, wire.DecodeUpProgress, func(t *testing.T, u *wire.UpProgress) {
		if u.Host < 0 || u.Host >= wire.MaxHosts || len(u.Ranks) > wire.MaxWorld {
			t.Fatalf("accepted %+v", u)
		}
		for _, r := range u.Ranks {
			if r.Rank < 0 || r.Rank >= wire.MaxWorld || r.Committed < -1 || r.Committed > wire.MaxStep ||
				r.Replicated < -1 || r.Replicated > r.Committed || r.Stages < 0 || r.WaitNS < 0 ||
				r.Base < -1 || r.Base > max(r.Replicated, 0) ||
				r.ReplBaseBytes < 0 || r.ReplDiffBytes < 0 || r.ReplBaseBytes+r.ReplDiffBytes > r.ReplBytes {
				t.Fatalf("accepted %+v", r)
			}
			if d := r.D; d != nil {
				for i, m := range d.Markers {
					if m < 0 || m > r.Committed || i > 0 && m <= d.Markers[i-1] {
						t.Fatalf("accepted durable markers %v, committed %d", d.Markers, r.Committed)
					}
				}
				if d.Resolved < -1 || d.Resolved > r.Committed {
					t.Fatalf("accepted durable resolved step %d, committed %d", d.Resolved, r.Committed)
				}
				if len(d.Markers) > wire.MaxDurableMarkers || len(d.Regions) > wire.MaxDurableRegions || d.N < 0 || d.N > wire.MaxCkptConcurrency ||
					d.Saves < 0 || d.Skipped < 0 || d.Failed < 0 || d.WriteNS < 0 || d.Bytes < 0 || d.HoldNS < 0 {
					t.Fatalf("accepted durable report %+v", d)
				}
			}
		}
		if f := u.Fold; f != nil {
			if f.Steps < 0 || f.NS < 0 {
				t.Fatalf("accepted fold %+v", f)
			}
			for _, d := range f.Drift {
				if d.Rank < 0 || d.Rank >= wire.MaxWorld || d.Step < 0 || d.Steps < 0 || d.NonFinite < 0 ||
					!(d.MaxAbs >= 0) || !(d.RelRMS >= 0) || math.IsInf(d.MaxAbs, 0) || math.IsInf(d.RelRMS, 0) {
					t.Fatalf("accepted drift %+v", d)
				}
			}
		}
	},
		wire.Marshal(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{}, Fold: &wire.HostFold{Steps: 3, NS: 900,
			Drift: []wire.FoldDrift{{Rank: 2, Step: 100, Steps: 100, MaxAbs: 1e-3, RelRMS: 2e-4, NonFinite: 1}}}}),
		[]byte(`{"h":0,"gen":0,"ranks":[],"fold":{"s":1,"t":1,"d":[{"r":0,"s":1,"n":1,"m":-1,"q":0}]}}`),
		[]byte(`{"h":0,"gen":0,"ranks":[],"fold":{"s":1,"t":1,"d":[{"r":-1,"s":1,"n":1,"m":0,"q":0}]}}`),
		[]byte(`{"h":0,"gen":0,"ranks":[],"fold":{"s":1,"t":1,"d":[{"r":0,"s":1,"n":1,"m":1e309,"q":0}]}}`),
		wire.Marshal(&wire.UpProgress{Host: 1, Gen: 2, Ranks: []wire.RankProgress{{Rank: 2, Committed: 7, Replicated: 6, Stages: 8, WaitNS: 100}}}),
		wire.Marshal(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: 7, Replicated: 6, ReplBytes: 30, ReplBaseBytes: 10, ReplDiffBytes: 20}},
			Fold: &wire.HostFold{Steps: 3, NS: 900}}),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":1,"p":1,"rb":10,"rbb":6,"rdb":6}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[],"fold":{"s":-1,"t":0}}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":-1,"p":-1}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":3,"p":4}]}`),
		wire.Marshal(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: 17, Replicated: 16, Base: 8}}}),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":7,"p":6,"b":-1}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":7,"p":6,"b":8}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":-1,"p":-1,"b":1}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":-1,"p":-1,"b":-2}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":20,"p":10,"dur":{"m":[10,20],"s":2,"k":1,"f":0,"t":100,"b":4096,"h":5,"n":1,"rg":[{"n":"optimizer","s":4096}]}}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":5,"p":5,"dur":{"m":[10]}}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":50,"p":5,"dur":{"m":[10,3]}}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":20,"p":10,"dur":{"m":[10,20],"x":16}}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":-1,"p":-1,"dur":{"x":-1}}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":20,"p":10,"dur":{"x":21}}]}`),
		[]byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":20,"p":10,"dur":{"x":-2}}]}`),
	)
}

func FuzzDecodeGlobalStep(f *testing.F) {
	fuzzJSON(f, wire.DecodeGlobalStep, func(t *testing.T, g *wire.GlobalStep) {
		if g.G < -1 || g.G > wire.MaxStep || g.H < -1 || g.G >= 0 && g.H > g.G || g.G < 0 && g.H > 0 ||
			g.D != nil && (*g.D < 0 || *g.D > g.G) || g.X != nil && (*g.X < 0 || *g.X > g.G || g.D != nil && *g.D > *g.X) {
			t.Fatalf("accepted %+v", g)
		}
	},
		wire.Marshal(&wire.GlobalStep{Gen: 1, G: 5}),
		wire.Marshal(&wire.GlobalStep{Gen: 1, G: 17, H: 16}),
		wire.Marshal(&wire.GlobalStep{Gen: 1, G: 5, H: -1}),
		[]byte(`{"gen":0,"g":-2}`),
		[]byte(`{"gen":0,"g":5,"h":6}`),
		[]byte(`{"gen":0,"g":-1,"h":1}`),
		[]byte(`{"gen":0,"g":5,"h":-2}`),
		[]byte(`{"gen":0,"g":5,"d":5}`),
		[]byte(`{"gen":0,"g":5,"d":6}`),
		[]byte(`{"gen":0,"g":-1,"d":0}`),
		[]byte(`{"gen":0,"g":9,"d":4,"x":8}`),
		[]byte(`{"gen":0,"g":9,"x":8}`),
		[]byte(`{"gen":0,"g":9,"d":4,"x":3}`),
		[]byte(`{"gen":0,"g":9,"d":4,"x":10}`),
		[]byte(`{"gen":0,"g":9,"x":-1}`),
	)
}

func FuzzDecodeHeartbeat(f *testing.F) {
	fuzzJSON(f, wire.DecodeHeartbeat, func(t *testing.T, h *wire.Heartbeat) {
		if h.Host < 0 || h.Host >= wire.MaxHosts {
			t.Fatalf("accepted %+v", h)
		}
	},
		wire.Marshal(&wire.Heartbeat{Host: 3, Seq: 99}),
		[]byte(`{"h":1048576,"s":0}`),
	)
}

func FuzzDecodeEpochTable(f *testing.F) {
	for _, tab := range []*wire.EpochTable{
		table(1, []int{0}),
		clusterTable(4, 2, false),
		clusterTable(4, 2, true),
		table(7, []int{0, 2, 4}, nil, []int{1, 3, 5}, []int{6}),
		table(6, []int{5, 0, 3}, []int{1, 2, 4}),
		table(2, []int{0, 1}, []int{1}), // duplicate rank
		table(3, []int{0}, []int{2}),    // missing rank
		memberTable(),
		ecTable(),
		ecRecoveryTable(),
		ecDiffTable(),
		func() *wire.EpochTable { // a recovery epoch of diff mode under EC
			t := ecDiffTable()
			t.Epoch, t.Gen, t.G, t.H = 2, 1, 41, 32
			return t
		}(),
		func() *wire.EpochTable { // invalid: a rank its own log holder
			t := ecDiffTable()
			t.Logs[0].Holders[0] = 0
			return t
		}(),
		func() *wire.EpochTable { // invalid: H past G
			t := ecDiffTable()
			t.G, t.H = 5, 6
			return t
		}(),
		func() *wire.EpochTable { // invalid: data groups of unequal length
			t := ecTable()
			t.EC.Groups[0].DataGroups = [][]int{{0, 1, 2}, {3, 4, 5, 6, 7}}
			return t
		}(),
	} {
		f.Add(tab.Encode())
	}
	f.Add([]byte{'T', 5})
	f.Add([]byte{'T', 4})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := wire.DecodeEpochTable(b)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("error %q does not wrap ErrMalformed", err)
			}
			if tab != nil {
				t.Fatalf("table returned with error %v", err)
			}
			return
		}
		if err := tab.Validate(); err != nil {
			t.Fatalf("decoded table does not validate: %v", err)
		}
		enc := tab.Encode()
		tab2, err := wire.DecodeEpochTable(enc)
		if err != nil {
			t.Fatalf("re-encoding fails to decode: %v", err)
		}
		if !reflect.DeepEqual(tab, tab2) {
			t.Fatalf("re-encoding changes the table:\n first %+v\nsecond %+v", tab, tab2)
		}
		if enc2 := tab2.Encode(); !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable: %q then %q", enc, enc2)
		}
		if len(enc) > len(b) {
			t.Fatalf("re-encoding is %d bytes, input was %d", len(enc), len(b))
		}
		// Placements allocates per rank; keep the check cheap.
		if tab.World <= 1<<16 {
			checkPlacements(t, tab)
		}
	})
}

// checkPlacements checks the placements of a valid table: every rank once,
// local ranks and sizes consistent, node ranks dense over hosts with ranks.
func checkPlacements(t *testing.T, tab *wire.EpochTable) {
	t.Helper()
	ps := tab.Placements()
	if len(ps) != len(tab.Hosts) {
		t.Fatalf("Placements() has %d hosts, table %d", len(ps), len(tab.Hosts))
	}
	seen := make([]bool, tab.World)
	node := 0
	for h, hp := range ps {
		if len(hp) == 0 {
			continue
		}
		for l, p := range hp {
			if p.Host != h || p.LocalRank != l || p.LocalSize != len(hp) || p.NodeRank != node {
				t.Fatalf("host %d local rank %d: bad placement %+v (node %d)", h, l, p, node)
			}
			if p.Rank < 0 || p.Rank >= tab.World || seen[p.Rank] {
				t.Fatalf("rank %d out of range or placed twice", p.Rank)
			}
			seen[p.Rank] = true
		}
		node++
	}
	for r, ok := range seen {
		if !ok {
			t.Fatalf("rank %d not placed", r)
		}
	}
	if n := tab.NodeCount(); n != node {
		t.Fatalf("NodeCount() = %d, %d hosts run ranks", n, node)
	}
}

func FuzzDecodeOutputFrame(f *testing.F) {
	fr := wire.NewOutputFrame(3)
	f.Add(bytes.Clone(fr.Bytes()), uint16(4))
	fr.Add(0, wire.Stdout, []byte("hello\n"))
	fr.Add(3, wire.Stderr, []byte("a\x00b"))
	fr.Add(1, wire.Stdout, nil)
	f.Add(bytes.Clone(fr.Bytes()), uint16(4))
	f.Add(bytes.Clone(fr.Bytes()), uint16(3)) // rank 3 out of range
	fr.Reset(70000)
	fr.Add(300, wire.Stderr, bytes.Repeat([]byte("x\n"), 100))
	f.Add(bytes.Clone(fr.Bytes()), uint16(301))
	f.Add([]byte{'O', 1, 0, 0, 1, 5, 'a'}, uint16(1)) // length past end
	f.Fuzz(func(t *testing.T, b []byte, w uint16) {
		world := int(w)
		host := -1
		var recs []wire.OutputRecord
		err := wire.DecodeOutputFrame(b, world, func(h int, r wire.OutputRecord) {
			if host != -1 && h != host {
				t.Fatalf("records from hosts %d and %d", host, h)
			}
			host = h
			recs = append(recs, r)
		})
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("error %q does not wrap ErrMalformed", err)
			}
			if len(recs) != 0 {
				t.Fatalf("%d records delivered from an invalid frame", len(recs))
			}
			return
		}
		if len(recs) == 0 {
			return
		}
		if host < 0 || host >= wire.MaxHosts {
			t.Fatalf("host %d out of range", host)
		}
		total := 0
		re := wire.NewOutputFrame(host)
		for _, r := range recs {
			if r.Rank < 0 || r.Rank >= world || (r.Stream != wire.Stdout && r.Stream != wire.Stderr) {
				t.Fatalf("accepted record rank %d stream %d, world %d", r.Rank, r.Stream, world)
			}
			total += len(r.Data)
			re.Add(r.Rank, r.Stream, r.Data)
		}
		if total > len(b) || re.Len() > len(b) {
			t.Fatalf("%d bytes of data, re-encoded to %d bytes, from a %d-byte frame", total, re.Len(), len(b))
		}
		h2, recs2, err := decodeAll(t, re.Bytes(), world)
		if err != nil || h2 != host || !reflect.DeepEqual(recs, recs2) {
			t.Fatalf("re-encoding decodes to host %d, %d records, %v", h2, len(recs2), err)
		}
	})
}
