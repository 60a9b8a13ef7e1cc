package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/wire"
)

// TestDurableBoundsMatchPackage: the wire's bounds of the durable tier
// are package durable's (wire cannot import it: durable imports wire).
func TestDurableBoundsMatchPackage(t *testing.T) {
	if wire.MaxCkptConcurrency != durable.MaxConcurrency || wire.MaxDurableRegions != durable.MaxRegions || wire.MaxRegionSize != durable.MaxRegionSize {
		t.Fatalf("wire bounds %d/%d/%d, durable's %d/%d/%d", wire.MaxCkptConcurrency, wire.MaxDurableRegions, int64(wire.MaxRegionSize),
			durable.MaxConcurrency, durable.MaxRegions, int64(durable.MaxRegionSize))
	}
	if wire.MaxDurableMarkers < durable.MaxConcurrency+1 {
		t.Fatalf("MaxDurableMarkers %d cannot hold the markers of %d base files", wire.MaxDurableMarkers, durable.MaxConcurrency+1)
	}
}

func durableSpec(f func(*wire.JobSpec)) *wire.JobSpec {
	s := validSpec()
	s.CkptDir, s.CkptEvery, s.CkptOverhead = "/ckpt/job", 100, 0.03
	f(s)
	return s
}

// TestDecodeDurableSpec: the durable settings of a job spec travel whole
// and are bounded; none may come without a directory.
func TestDecodeDurableSpec(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *wire.JobSpec
	}{
		{"defaults", durableSpec(func(*wire.JobSpec) {})},
		{"every setting", durableSpec(func(s *wire.JobSpec) {
			s.CkptEvery, s.CkptConcurrency, s.CkptOverhead, s.DiffBatch, s.Resume = wire.MaxCkptEvery, wire.MaxCkptConcurrency, 0.5, wire.MaxDiffBatch, true
		})},
		{"lowest", durableSpec(func(s *wire.JobSpec) { s.CkptEvery, s.CkptConcurrency, s.CkptOverhead, s.DiffBatch = 1, 1, 1e-9, 1 })},
		{"longest path", durableSpec(func(s *wire.JobSpec) { s.CkptDir = "/" + strings.Repeat("d", wire.MaxCkptDir-1) })},
	} {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, &wire.RegisterReply{Spec: tc.spec}, wire.DecodeRegisterReply) })
	}
	reply := func(f func(*wire.JobSpec)) []byte { return wire.Marshal(&wire.RegisterReply{Spec: durableSpec(f)}) }
	testRejects(t, wire.DecodeRegisterReply, []rejectCase{
		{"every without a directory", reply(func(s *wire.JobSpec) { s.CkptDir, s.CkptOverhead = "", 0 })},
		{"overhead without a directory", reply(func(s *wire.JobSpec) { s.CkptDir, s.CkptEvery = "", 0 })},
		{"resume without a directory", wire.Marshal(&wire.RegisterReply{Spec: func() *wire.JobSpec { s := validSpec(); s.Resume = true; return s }()})},
		{"batch without a directory", wire.Marshal(&wire.RegisterReply{Spec: func() *wire.JobSpec { s := validSpec(); s.DiffBatch = 5; return s }()})},
		{"relative directory", reply(func(s *wire.JobSpec) { s.CkptDir = "ckpt" })},
		{"NUL in the directory", reply(func(s *wire.JobSpec) { s.CkptDir = "/ckpt\x00x" })},
		{"directory too long", reply(func(s *wire.JobSpec) { s.CkptDir = "/" + strings.Repeat("d", wire.MaxCkptDir) })},
		{"every zero", reply(func(s *wire.JobSpec) { s.CkptEvery = 0 })},
		{"every too long", reply(func(s *wire.JobSpec) { s.CkptEvery = wire.MaxCkptEvery + 1 })},
		{"negative concurrency", reply(func(s *wire.JobSpec) { s.CkptConcurrency = -1 })},
		{"concurrency too high", reply(func(s *wire.JobSpec) { s.CkptConcurrency = wire.MaxCkptConcurrency + 1 })},
		{"overhead zero", reply(func(s *wire.JobSpec) { s.CkptOverhead = 0 })},
		{"overhead one", reply(func(s *wire.JobSpec) { s.CkptOverhead = 1 })},
		{"negative overhead", reply(func(s *wire.JobSpec) { s.CkptOverhead = -0.5 })},
		{"negative batch", reply(func(s *wire.JobSpec) { s.DiffBatch = -1 })},
		{"batch too long", reply(func(s *wire.JobSpec) { s.DiffBatch = wire.MaxDiffBatch + 1 })},
		{"overhead not a number", []byte(`{"spec":{"prog":"p","hb":1,"cdir":"/c","cevery":1,"cover":"0.1"}}`)},
	})
}

// TestDecodeDurableProgress: a rank's durable report is bounded, its
// markers ascending and committed.
func TestDecodeDurableProgress(t *testing.T) {
	progress := func(committed int64, d *wire.RankDurable) []byte {
		return wire.Marshal(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: committed, Replicated: -1, D: d}}})
	}
	markers := func(n int) []int64 {
		m := make([]int64, n)
		for i := range m {
			m[i] = int64(i)
		}
		return m
	}
	regions := func(n int) []wire.DurableRegion {
		rs := make([]wire.DurableRegion, n)
		for i := range rs {
			rs[i] = wire.DurableRegion{Name: "r", Size: 1}
		}
		return rs
	}
	full := &wire.RankDurable{Markers: []int64{0, 10, 20}, Resolved: 16, Saves: 3, Skipped: 1, Failed: 2, WriteNS: 9e8, Bytes: 3 << 30, HoldNS: 5, N: wire.MaxCkptConcurrency,
		Regions: []wire.DurableRegion{{Name: "optimizer", Size: wire.MaxRegionSize}, {Name: strings.Repeat("m", wire.MaxRegionName), Size: 0}}, Off: "disk gone",
		Log: &wire.DiffLogStats{Steps: 40, Dropped: 8, Failed: 2, LastErr: "no space left on device"}}
	for _, tc := range []struct {
		name      string
		committed int64
		d         *wire.RankDurable
	}{
		{"none", 7, nil},
		{"empty", -1, &wire.RankDurable{Resolved: -1}},
		{"resolved at committed", 10, &wire.RankDurable{Resolved: 10}},
		{"every field", 20, full},
		{"marker at committed", 10, &wire.RankDurable{Markers: []int64{10}}},
		{"most markers", wire.MaxDurableMarkers, &wire.RankDurable{Markers: markers(wire.MaxDurableMarkers)}},
		{"most regions", 0, &wire.RankDurable{Regions: regions(wire.MaxDurableRegions)}},
		{"log without losses", 0, &wire.RankDurable{Log: &wire.DiffLogStats{Steps: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: tc.committed, Replicated: -1, D: tc.d}}}
			roundTrip(t, u, wire.DecodeUpProgress)
		})
	}
	testRejects(t, wire.DecodeUpProgress, []rejectCase{
		{"marker past committed", progress(9, &wire.RankDurable{Markers: []int64{10}})},
		{"marker without a commit", progress(-1, &wire.RankDurable{Markers: []int64{0}})},
		{"negative marker", progress(9, &wire.RankDurable{Markers: []int64{-1}})},
		{"markers descending", progress(9, &wire.RankDurable{Markers: []int64{8, 4}})},
		{"marker twice", progress(9, &wire.RankDurable{Markers: []int64{4, 4}})},
		{"too many markers", progress(wire.MaxStep, &wire.RankDurable{Markers: markers(wire.MaxDurableMarkers + 1)})},
		{"resolved past committed", progress(9, &wire.RankDurable{Resolved: 10})},
		{"resolved without a commit", progress(-1, &wire.RankDurable{})},
		{"resolved below -1", progress(9, &wire.RankDurable{Resolved: -2})},
		{"negative saves", progress(9, &wire.RankDurable{Saves: -1})},
		{"negative skipped", progress(9, &wire.RankDurable{Skipped: -1})},
		{"negative failed", progress(9, &wire.RankDurable{Failed: -1})},
		{"negative write time", progress(9, &wire.RankDurable{WriteNS: -1})},
		{"negative bytes", progress(9, &wire.RankDurable{Bytes: -1})},
		{"negative hold", progress(9, &wire.RankDurable{HoldNS: -1})},
		{"concurrency too high", progress(9, &wire.RankDurable{N: wire.MaxCkptConcurrency + 1})},
		{"negative concurrency", progress(9, &wire.RankDurable{N: -1})},
		{"too many regions", progress(9, &wire.RankDurable{Regions: regions(wire.MaxDurableRegions + 1)})},
		{"unnamed region", progress(9, &wire.RankDurable{Regions: []wire.DurableRegion{{Size: 1}}})},
		{"region name too long", progress(9, &wire.RankDurable{Regions: []wire.DurableRegion{{Name: strings.Repeat("r", wire.MaxRegionName+1)}}})},
		{"negative region", progress(9, &wire.RankDurable{Regions: []wire.DurableRegion{{Name: "r", Size: -1}}})},
		{"region too large", progress(9, &wire.RankDurable{Regions: []wire.DurableRegion{{Name: "r", Size: wire.MaxRegionSize + 1}}})},
		{"reason too long", progress(9, &wire.RankDurable{Off: tooLong})},
		{"negative log steps", progress(9, &wire.RankDurable{Log: &wire.DiffLogStats{Steps: -1}})},
		{"negative log dropped", progress(9, &wire.RankDurable{Log: &wire.DiffLogStats{Dropped: -1}})},
		{"negative log failed", progress(9, &wire.RankDurable{Log: &wire.DiffLogStats{Failed: -1}})},
		{"log error too long", progress(9, &wire.RankDurable{Log: &wire.DiffLogStats{LastErr: tooLong}})},
		{"unknown log field", []byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":9,"p":1,"dur":{"x":-1,"dl":{"zz":1}}}]}`)},
		{"markers not numbers", []byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":9,"p":1,"dur":{"m":["1"]}}]}`)},
		{"unknown durable field", []byte(`{"h":0,"gen":0,"ranks":[{"r":0,"c":9,"p":1,"dur":{"zz":1}}]}`)},
	})
}

// TestDecodeGlobalStepDurable: the durable watermark D and resolved step
// X of a GlobalStep are steps with D <= X <= G; absent, there is none.
func TestDecodeGlobalStepDurable(t *testing.T) {
	d := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name string
		g    int64
		d, x *int64
		ok   bool
	}{
		{"none", 5, nil, nil, true},
		{"none, nothing protected", -1, nil, nil, true},
		{"step 0", 5, d(0), nil, true},
		{"at G", 40, d(40), nil, true},
		{"below G", 47, d(40), nil, true},
		{"past G", 39, d(40), nil, false},
		{"without G", -1, d(0), nil, false},
		{"negative", 5, d(-1), nil, false},
		{"resolved", 47, d(40), d(44), true},
		{"resolved at D and G", 40, d(40), d(40), true},
		{"resolved without D", 47, nil, d(0), true},
		{"resolved below D", 47, d(40), d(39), false},
		{"resolved past G", 47, d(40), d(48), false},
		{"resolved negative", 47, nil, d(-1), false},
		{"resolved without G", -1, nil, d(0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := wire.DecodeGlobalStep(wire.Marshal(&wire.GlobalStep{Gen: 1, G: tc.g, D: tc.d, X: tc.x}))
			switch {
			case tc.ok && err != nil:
				t.Fatalf("DecodeGlobalStep: %v", err)
			case tc.ok && (g.D == nil) != (tc.d == nil), tc.ok && g.D != nil && *g.D != *tc.d:
				t.Fatalf("decoded D %v, want %v", g.D, tc.d)
			case tc.ok && (g.X == nil) != (tc.x == nil), tc.ok && g.X != nil && *g.X != *tc.x:
				t.Fatalf("decoded X %v, want %v", g.X, tc.x)
			case !tc.ok && !errors.Is(err, wire.ErrMalformed):
				t.Fatalf("DecodeGlobalStep = %+v, %v; want ErrMalformed", g, err)
			}
		})
	}
}
