package hotswap

import (
	"testing"
	"time"
)

// TestSpliceEpoch: a Splice names the epoch it begins, and the
// UnderProtected after it that epoch too, so that a caller recording
// failures by epoch files each loss under its own epoch when one step
// loses several hosts (two heartbeat timeouts in one tick); the machine's
// Epoch() after the step is the last one's only.
func TestSpliceEpoch(t *testing.T) {
	tests := []struct {
		name   string
		config string
		under  bool // each splice leaves shards under-protected
	}{
		{"replicas=1", "config hosts=h0,h1,h2,s0,s1 spares=s0,s1 world=3 replicas=1 heartbeat-timeout=3s", true},
		{"no redundancy", "config hosts=h0,h1,h2,s0,s1 spares=s0,s1 world=3 heartbeat-timeout=3s", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &driver{}
			for _, c := range []string{tc.config, "event heartbeat host=all at=1s", "event heartbeat host=h0 at=3s", "event heartbeat host=s0 at=3.5s", "event heartbeat host=s1 at=3.5s"} {
				if o := d.run(c); len(o) > 5 && o[:5] == "error" {
					t.Fatalf("%s: %s", c, o)
				}
			}
			before := d.m.Epoch()
			acts := d.m.Step(4100*time.Millisecond, Tick{})
			var splices []Splice
			var unders []UnderProtected
			for _, a := range acts {
				switch a := a.(type) {
				case Splice:
					splices = append(splices, a)
				case UnderProtected:
					if len(unders) != len(splices)-1 {
						t.Fatalf("under-protected not after its own splice: %v", acts)
					}
					unders = append(unders, a)
				}
			}
			if len(splices) != 2 {
				t.Fatalf("want 2 splices in one tick, got %d: %v", len(splices), acts)
			}
			for i, s := range splices {
				if want := before + uint64(i) + 1; s.Epoch != want {
					t.Errorf("splice of %s: epoch %d, want %d (actions %v)", s.LostName, s.Epoch, want, acts)
				}
			}
			if tc.under && len(unders) != 2 {
				t.Fatalf("want an under-protected after each splice, got %d: %v", len(unders), acts)
			}
			for i, u := range unders {
				if u.Epoch != splices[i].Epoch {
					t.Errorf("under-protected %v after the splice of %s: epoch %d, want its splice's %d", u.Owners, splices[i].LostName, u.Epoch, splices[i].Epoch)
				}
			}
			if got := d.m.Epoch(); got != splices[1].Epoch {
				t.Errorf("machine epoch %d, last splice's %d", got, splices[1].Epoch)
			}
		})
	}
}
