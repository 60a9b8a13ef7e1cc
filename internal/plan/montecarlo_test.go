package plan

import (
	"errors"
	"testing"
	"time"
)

func TestSimulateSeeded(t *testing.T) {
	in := baseInputs()
	a, err := Simulate(in, nil, 500, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Simulate(in, nil, 500, 7)
	if a != b {
		t.Errorf("same seed, different results:\n%+v\n%+v", a, b)
	}
	c, _ := Simulate(in, nil, 500, 8)
	if a == c {
		t.Errorf("seeds 7 and 8 gave the same result %+v", a)
	}
}

// With spares enough for every failure, the simulated mean of host
// replacement matches λ·L·E[C_DEADPOOL]; checkpoint-restart matches
// λ·L·E[C_ckpt] up to the first interval (no checkpoint yet), which the
// model ignores.
func TestSimulateMatchesModel(t *testing.T) {
	in := baseInputs()
	in.Spares = 1000
	mc, err := Simulate(in, nil, 4000, 1)
	if err != nil {
		t.Fatal(err)
	}
	mttf := in.MTTFSys()
	near(t, "failures per run", mc.Failures, in.JobLength/mttf, 0.02)
	near(t, "host replacement mean", mc.Replace.Mean, ExpectedLost(in.JobLength, mttf, HostReplaceCost(in).Total()), 0.02)
	near(t, "checkpoint-restart mean", mc.Ckpt.Mean, ExpectedLost(in.JobLength, mttf, CkptCost(in).Total()), 0.03)
	if mc.Replace.Fallbacks != 0 {
		t.Errorf("fallbacks = %v with 1000 spares", mc.Replace.Fallbacks)
	}
	if !(mc.Replace.P50 <= mc.Replace.P99 && mc.Ckpt.P50 <= mc.Ckpt.P99) {
		t.Errorf("p50 above p99: %+v %+v", mc.Replace, mc.Ckpt)
	}
}

// Without spares host replacement pays checkpoint-restart for every
// failure.
func TestSimulateNoSpares(t *testing.T) {
	in := baseInputs()
	in.Spares = 0
	mc, err := Simulate(in, nil, 200, 3)
	if err != nil {
		t.Fatal(err)
	}
	if mc.Replace.Fallbacks != mc.Failures {
		t.Errorf("fallbacks %v, want every failure (%v)", mc.Replace.Fallbacks, mc.Failures)
	}
}

func TestSimulateTrace(t *testing.T) {
	in := baseInputs()
	in.Spares = 1
	trace := []Failure{{At: time.Hour}, {At: 2 * time.Hour}, {At: 30 * 24 * time.Hour}} // the last after the job
	mc, err := Simulate(in, trace, 100, 1)
	if err != nil {
		t.Fatal(err)
	}
	if mc.Failures != 2 || !mc.FromTrace {
		t.Errorf("failures = %v (from trace %v), want the 2 within the job", mc.Failures, mc.FromTrace)
	}
	if mc.Replace.Fallbacks != 1 {
		t.Errorf("fallbacks = %v, want 1 (one spare, two failures)", mc.Replace.Fallbacks)
	}
}

func TestSimulateBounded(t *testing.T) {
	in := baseInputs()
	in.MTTFHost = 1 // a failure every 1/16 s for a week
	if _, err := Simulate(in, nil, 1000, 1); !errorsIs(err, ErrInput) {
		t.Errorf("Simulate = %v, want ErrInput (too many failures to simulate)", err)
	}
}

func TestSinceDurable(t *testing.T) {
	for _, c := range []struct {
		name                  string
		t, phase, k, tw, want float64
	}{
		{"before any durable", 5, 0, 100, 10, 5},
		{"just durable", 10, 0, 100, 10, 10},
		{"mid interval", 150, 0, 100, 10, 50},
		{"next still writing", 105, 0, 100, 10, 105},
		{"with phase", 60, 30, 100, 10, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := sinceDurable(c.t, c.phase, c.k, c.tw); got != c.want {
				t.Errorf("sinceDurable = %v, want %v", got, c.want)
			}
		})
	}
}

// TestSimulateBoundedRuns: runs are bounded even when few failures are
// expected, and too many failures per job blame the failure inputs, not
// the runs.
func TestSimulateBoundedRuns(t *testing.T) {
	for _, c := range []struct {
		name  string
		mttf  float64
		runs  int
		field string
	}{
		{"many runs, few failures", 1e12, 20_000_000, "Runs"},
		{"runs times failures", 96768, 1_000_000, "Runs"}, // 100 failures per job
		{"failures in one job", 1e-9, 1, "MTTFHost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := baseInputs()
			in.MTTFHost = c.mttf
			_, err := Simulate(in, nil, c.runs, 1)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Errorf("Simulate = %v, want a FieldError on %s", err, c.field)
			}
		})
	}
}
