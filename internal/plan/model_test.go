package plan

import (
	"fmt"
	"math"
	"testing"

	"github.com/gorun/gorun/topology"
)

func near(t *testing.T, name string, got, want, relTol float64) {
	t.Helper()
	if math.Abs(got-want) > relTol*math.Abs(want) {
		t.Errorf("%s = %.6g, want %.6g (±%g relative)", name, got, want, relTol)
	}
}

// DEADPOOL §IV's worked example: FT-HSDP at O(100K) GPUs, a checkpoint
// every K = 100 steps of t_step = 20 s: expected replay ≈ 16.7 min; with a
// failure every 18 min and a 10 min restart stall, η = 18/(18+10+16.7).
func TestDeadpoolWorkedExample(t *testing.T) {
	replay := 20 * ExpectedReplaySteps(100) / 60 // minutes
	if math.Abs(replay-16.7) > 0.05 {
		t.Errorf("replay = %.4f min, want 16.7 ± 0.05", replay)
	}
	in := Inputs{
		MTTFHost: 18 * 60, Hosts: 1, RanksPerHost: 1, Step: 20, StateBytes: 1,
		MemBW: 1e12, NetBW: 1e12, DurableBW: math.Inf(1), // T_w = 0, as the example assumes
		Restart: 10 * 60, Interval: 100, Concurrency: 1, Overhead: 0.03, JobLength: 3600,
		Redundancy: topology.Redundancy{Replicas: 1},
	}
	c := CkptCost(in)
	near(t, "E[C_ckpt] (min)", c.Total()/60, 10+1000.0/60, 1e-9)
	near(t, "η_ckpt", Efficiency(in.MTTFSys(), c.Total()), 18/(18+10+1000.0/60), 1e-9)
	// The discrete E[R] of the text is (K−1)/2 whole steps: 49.5.
	near(t, "E[R]", ExpectedReplaySteps(100)-0.5, 49.5, 1e-12)
}

// DEADPOOL §V-a Eq. (1): D = 128, k = 1, p = 1e−6 gives P_loss ≤ 1.28e−10
// per step, 1.28e−5 over 10^5 steps; k = 2: 1.28e−11 over the run; and
// the correlated case, q = 1e−4: 0.128 (k = 1) and 1.28e−5 (k = 2).
func TestDeadpoolLossBound(t *testing.T) {
	for _, c := range []struct {
		name  string
		d, k  int
		p     float64
		steps float64
		want  float64
	}{
		{"D128 k1 per step", 128, 1, 1e-6, 1, 1.28e-10},
		{"D128 k1 1e5 steps", 128, 1, 1e-6, 1e5, 1.28e-5},
		{"D128 k2 1e5 steps", 128, 2, 1e-6, 1e5, 1.28e-11},
		{"domains q1e-4 k1", 128, 1, 1e-4, 1e5, 0.128},
		{"domains q1e-4 k2", 128, 2, 1e-4, 1e5, 1.28e-5},
	} {
		t.Run(c.name, func(t *testing.T) {
			near(t, "P_loss", ReplicaLossBound(c.d, c.k, c.p)*c.steps, c.want, 1e-9)
		})
	}
}

func TestECLossBound(t *testing.T) {
	p := 1e-3
	for _, c := range []struct {
		name        string
		g, k, m     int
		want, bound float64
	}{
		// ec:1+M keeps M+1 whole copies: replicas:M's D·p^(M+1), less the
		// (1−p)^0 factor, which is 1.
		{"ec:1+1 is replicas:1", 3, 1, 1, 3 * p * p, 3 * p * p},
		{"ec:2+2", 2, 2, 2, 2 * (4*math.Pow(p, 3)*(1-p) + math.Pow(p, 4)), 2 * 4 * math.Pow(p, 3)},
		{"ec:4+1", 1, 4, 1, 10*p*p*math.Pow(1-p, 3) + 10*math.Pow(p, 3)*math.Pow(1-p, 2) + 5*math.Pow(p, 4)*(1-p) + math.Pow(p, 5), 10 * p * p},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ECLossBound(c.g, c.k, c.m, p)
			near(t, "P_loss", got, c.want, 1e-9)
			if got > c.bound*(1+1e-12) {
				t.Errorf("P_loss %.6g above the bound G·C(K+M,M+1)·p^(M+1) = %.6g", got, c.bound)
			}
		})
	}
}

// PCcheck §3.4 Eq. (3), f* = ceil(T_w/(N·q·t)).
func TestIntervalFor(t *testing.T) {
	for _, c := range []struct {
		name string
		tw   float64
		n    int
		q, t float64
		want int
	}{
		{"T_w 50s N2 q1 t2s", 50, 2, 1, 2, 13},
		{"exact division", 40, 2, 1, 2, 10},
		{"q 1.03", 10.3, 1, 1.03, 1, 10},
		{"write shorter than a step", 0.5, 1, 1.03, 2, 1},
		{"no write", 0, 1, 1.03, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := IntervalFor(c.tw, c.n, c.q, c.t); got != c.want {
				t.Errorf("f* = %d, want %d", got, c.want)
			}
		})
	}
}

func TestStallAndLag(t *testing.T) {
	for _, c := range []struct {
		name               string
		tw, step           float64
		k, n               int
		wantStall, wantLag float64
	}{
		{"write fits in the interval", 10, 1, 100, 1, 0, 10},
		{"write longer: stalls", 150, 1, 100, 1, 50, 100},
		{"two in flight hide it", 150, 1, 100, 2, 0, 150},
		{"two in flight, still longer", 300, 1, 100, 2, 50, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := StallPerCheckpoint(c.tw, c.step, c.k, c.n); got != c.wantStall {
				t.Errorf("stall = %v, want %v", got, c.wantStall)
			}
			if got := WriteLag(c.tw, c.step, c.k, c.n); got != c.wantLag {
				t.Errorf("lag = %v, want %v", got, c.wantLag)
			}
		})
	}
}

func baseInputs() Inputs {
	return Inputs{
		MTTFHost: 30 * 24 * 3600, Hosts: 16, RanksPerHost: 4, Step: 2, StateBytes: 1 << 30,
		MemBW: 10e9, NetBW: 1.25e9, DurableBW: 1e9, Restart: 600, Replace: 20,
		Interval: 100, Concurrency: 1, Overhead: 0.03, Spares: 2, JobLength: 7 * 24 * 3600,
		Redundancy: topology.Redundancy{Replicas: 1},
	}
}

func TestHostReplaceCostTerms(t *testing.T) {
	in := baseInputs()
	c := HostReplaceCost(in)
	hb := float64(4 << 30)
	near(t, "restore", c.Restore, hb/1.25e9, 1e-12)
	near(t, "replay", c.Replay, 1, 1e-12)
	near(t, "recover", c.Recover, 20, 1e-12)
	// protect = 4 GiB/10 GB/s + 4 GiB/1.25 GB/s = 3.87 s > 2 s step
	protect := hb/10e9 + hb/1.25e9
	near(t, "ProtectTime", ProtectTime(in), protect, 1e-12)
	tw := hb / 1e9 // 4.29 s, within 100 steps: no checkpoint stall
	near(t, "overhead", c.Overhead, (protect-2)/2*in.MTTFSys()+StallPerCheckpoint(tw, 2, 100, 1), 1e-9)

	ec := in
	ec.Redundancy = topology.Redundancy{ECK: 2, ECM: 2}
	// a parity host receives the shares of the group's 12 ranks on other
	// hosts, each a whole shard (TestECWireTraffic)
	near(t, "ec ProtectTime", ProtectTime(ec), hb/10e9+12*float64(1<<30)/1.25e9, 1e-12)

	none := in
	none.Redundancy = topology.Redundancy{}
	if HostReplaceCost(none) != CkptCost(none) {
		t.Errorf("replicas:0: host replacement should cost what checkpoint-restart does")
	}
}

func TestSparesNeeded(t *testing.T) {
	in := baseInputs()
	for _, c := range []struct {
		name      string
		mu        float64
		spares    int
		threshold float64
		want      int
		wantPOut  float64
	}{
		// Poisson(2): P(N > 5) = 0.0166, P(N > 6) = 0.00453; P(N > 2) = 0.3233
		{"mu 2", 2, 2, 0.01, 6, 1 - math.Exp(-2)*(1+2+2)},
		{"mu 2 loose", 2, 6, 0.02, 5, 1 - math.Exp(-2)*(1+2+2+8.0/6+16.0/24+32.0/120+64.0/720)},
		{"no failures", 0, 0, 0.01, 0, 0},
		{"mu 1000 (large, no underflow)", 1000, 1100, 0.01, 1074, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			in.Hosts = 1
			in.JobLength = c.mu * in.MTTFHost
			in.Spares = c.spares
			need, pOut := SparesNeeded(in, c.threshold)
			if need != c.want {
				t.Errorf("spares needed = %d, want %d", need, c.want)
			}
			if c.wantPOut >= 0 && math.Abs(pOut-c.wantPOut) > 1e-9 {
				t.Errorf("P(run out) = %.6g, want %.6g", pOut, c.wantPOut)
			}
		})
	}
}

func TestLossBoundUnits(t *testing.T) {
	in := baseInputs()
	got, units, w := LossBound(in)
	p := FailureProb(w, in.MTTFHost)
	if units != 16 {
		t.Errorf("units = %d, want 16 hosts", units)
	}
	near(t, "replicas:1", got, 16*p*p, 1e-12)
	in.Redundancy = topology.Redundancy{ECK: 2, ECM: 2}
	got, units, w = LossBound(in)
	if units != 4 {
		t.Errorf("units = %d, want 4 groups", units)
	}
	near(t, "ec:2+2", got, ECLossBound(4, 2, 2, FailureProb(w, in.MTTFHost)), 1e-12)
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*Inputs)
		want string
	}{
		{"ok", func(*Inputs) {}, ""},
		{"zero step", func(in *Inputs) { in.Step = 0 }, "Step"},
		{"NaN mttf", func(in *Inputs) { in.MTTFHost = math.NaN() }, "MTTFHost"},
		{"no hosts", func(in *Inputs) { in.Hosts = 0 }, "Hosts"},
		{"overhead 1", func(in *Inputs) { in.Overhead = 1 }, "Overhead"},
		{"ec wider than hosts", func(in *Inputs) { in.Redundancy = topology.Redundancy{ECK: 16, ECM: 2} }, "ec:16+2"},
		{"replicas as many as hosts", func(in *Inputs) { in.Redundancy = topology.Redundancy{Replicas: 16} }, "replicas:16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := baseInputs()
			c.edit(&in)
			err := in.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errorsIs(err, ErrInput) || !contains(err.Error(), c.want) {
				t.Errorf("Validate = %v, want an ErrInput naming %s", err, c.want)
			}
		})
	}
}

func TestExpectedBeyondSpares(t *testing.T) {
	e2 := math.Exp(-2)
	for _, c := range []struct {
		name   string
		mu     float64
		spares int
		want   float64
	}{
		{"no spares: every failure", 2, 0, 2},
		{"one spare", 2, 1, 1 + e2},                        // μ − P(N ≥ 1)
		{"two spares", 2, 2, 2 - (e2*2*1 + 2*(1-e2-2*e2))}, // μ − (P(N=1) + 2·P(N≥2))
		{"plenty", 2, 60, 0},
		{"no failures", 0, 3, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := ExpectedBeyondSpares(c.mu, c.spares); math.Abs(got-c.want) > 1e-12 {
				t.Errorf("E[(N−S)+] = %.15g, want %.15g", got, c.want)
			}
		})
	}
}

// Plan's expected loss for host replacement, spares running out
// included, agrees with its Monte Carlo.
func TestPlanExpectedMatchesMonteCarlo(t *testing.T) {
	for _, spares := range []int{0, 1, 3, 100} {
		t.Run(fmt.Sprint(spares, " spares"), func(t *testing.T) {
			in := baseInputs()
			in.Spares = spares
			res, err := Plan(in, nil, 4000, 2, 0.01)
			if err != nil {
				t.Fatal(err)
			}
			near(t, "host replacement expected vs simulated", res.HostReplace.MonteCarlo.Mean, res.HostReplace.ExpectedLost, 0.03)
			near(t, "fallbacks vs E[(N−S)+]", res.HostReplace.MonteCarlo.Fallbacks+1e-9, res.HostReplace.NoSpare+1e-9, 0.05)
		})
	}
}

// Huge spares or hosts do not make the models loop for ever.
func TestBounded(t *testing.T) {
	if got := ExpectedBeyondSpares(10, math.MaxInt); got != 0 {
		t.Errorf("E[(N−S)+] with unbounded spares = %v", got)
	}
	in := baseInputs()
	in.Spares = math.MaxInt
	if err := in.Validate(); !errorsIs(err, ErrInput) {
		t.Errorf("Validate with MaxInt spares = %v", err)
	}
	in = baseInputs()
	in.Hosts = MaxHosts + 1
	if err := in.Validate(); !errorsIs(err, ErrInput) {
		t.Errorf("Validate with %d hosts = %v", in.Hosts, err)
	}
}
