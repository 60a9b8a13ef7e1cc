package hotswap

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

func hosts(spec ...int) []topology.Host {
	hs := make([]topology.Host, len(spec))
	for i, s := range spec {
		hs[i] = topology.Host{Name: "h" + string(rune('0'+i)), Slots: s}
	}
	return hs
}

func TestConfigValidation(t *testing.T) {
	good := func() Config {
		return Config{World: 4, Hosts: hosts(2, 2, 2), Spares: 1, Assign: []int{0, 0, 1, 1},
			Holders: [][]int{{2}, {3}, {0}, {1}}}
	}
	tests := []struct {
		name string
		edit func(c *Config)
		want string // "" = valid
	}{
		{"valid", func(c *Config) {}, ""},
		{"no ranks", func(c *Config) { c.World = 0 }, "world size 0"},
		{"no hosts", func(c *Config) { c.Hosts = nil }, "no hosts"},
		{"negative spares", func(c *Config) { c.Spares = -1 }, "-1 spares for 3 hosts"},
		{"every host a spare", func(c *Config) { c.Spares = 3 }, "3 spares for 3 hosts"},
		{"spares marked on every host", func(c *Config) {
			for i := range c.Hosts {
				c.Hosts[i].Spare = true
			}
		}, "every host is a spare"},
		{"spares leave too few slots", func(c *Config) { c.Spares = 2; c.Holders = nil }, "4 ranks but the hosts that are not spares have 2 slots"},
		{"rank on a spare", func(c *Config) { c.Assign = []int{0, 0, 2, 2} }, "rank 2 on spare host h2"},
		{"assignment short", func(c *Config) { c.Assign = c.Assign[:3] }, "3 ranks assigned for a world of 4"},
		{"host out of range", func(c *Config) { c.Assign[3] = 9 }, "rank 3 on host 9"},
		{"host over its slots", func(c *Config) { c.Assign = []int{0, 0, 0, 1}; c.Holders = nil }, "host h0 has 3 ranks for 2 slots"},
		{"duplicate host", func(c *Config) { c.Hosts[1].Name = "h0" }, "host h0 given twice"},
		{"unnamed host", func(c *Config) { c.Hosts[1].Name = "" }, "host 1 has no name"},
		{"no slots", func(c *Config) { c.Hosts[0].Slots = 0 }, "host h0 has 0 slots"},
		{"max slots below slots", func(c *Config) { c.Hosts[0].MaxSlots = 1 }, "max_slots 1 below its 2 slots"},
		{"unknown recovery", func(c *Config) { c.Recovery = 7 }, "unknown recovery mode 7"},
		{"unknown policy", func(c *Config) { c.OnNoSpare = 3 }, "unknown on-no-spare policy 3"},
		{"negative restarts", func(c *Config) { c.MaxRestarts = -1 }, "max restarts -1"},
		{"negative window", func(c *Config) { c.FailWindow = -time.Second }, "fail window -1s"},
		{"negative suspect timeout", func(c *Config) { c.SuspectTimeout = -1 }, "suspect timeout"},
		{"holders short", func(c *Config) { c.Holders = c.Holders[:2] }, "replica holders for 2 ranks"},
		{"holder on own host", func(c *Config) { c.Holders[0] = []int{1} }, "holder 1 is on its own host h0"},
		{"holder not a rank", func(c *Config) { c.Holders[0] = []int{4} }, "holder 4 is not a rank"},
		{"two holders on one host", func(c *Config) { c.Holders[0] = []int{2, 3} }, "two replica holders (2 and 3) on host h1"},
		{"holder not a DP peer", func(c *Config) { c.TP = 2; c.Holders[0] = []int{3} }, "holder 3 is not a data-parallel peer"},
		{"layout does not divide", func(c *Config) { c.TP = 3; c.Holders = nil }, "not a multiple of tp 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.edit(&c)
			m, err := New(c)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if m.cfg.FailWindow != DefaultFailWindow || m.cfg.SuspectTimeout != DefaultSuspectTimeout ||
					m.cfg.HeartbeatTimeout != DefaultHeartbeatTimeout || m.cfg.KillGrace != DefaultKillGrace {
					t.Errorf("defaults not filled: %+v", m.cfg)
				}
				return
			}
			if err == nil {
				t.Fatalf("New succeeded; want error containing %q", tt.want)
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "hotswap: ") {
				t.Errorf("error %q; want it to contain %q", err, tt.want)
			}
		})
	}
}

// New copies what it is given: the caller's slices stay the caller's.
func TestConfigCopied(t *testing.T) {
	c := Config{World: 2, Hosts: hosts(1, 1, 1), Spares: 1, Assign: []int{0, 1}, Holders: [][]int{{1}, {0}}}
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	m.Step(0, AgentRegistered{Host: 2, Spare: true})
	m.Step(0, GPublished{G: 1})
	m.Step(time.Second, AgentExited{Host: 1, Why: "gone"})
	if c.Assign[1] != 1 || c.Holders[0][0] != 1 || c.Hosts[2].Spare {
		t.Errorf("caller's config changed: %+v", c)
	}
	if m.RankHost(1) != 2 {
		t.Errorf("rank 1 on host %d; want the spare, 2", m.RankHost(1))
	}
}
