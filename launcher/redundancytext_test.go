package launcher

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/topology"
)

// TestRedundancyOneHost: a one-host job asked for nothing (the default
// --replicas 1, which a single host cannot place) has no replica in
// place, and gorun status, the events file's launch record and -v's
// "survives" say so alike: replicas:0. Before the fix status said
// replicas:1 (the configured value) while the events file said
// replicas:0.
func TestRedundancyOneHost(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg")
	stop := filepath.Join(t.TempDir(), "stop")
	var ev bytes.Buffer
	r := startRun(t, 4, `echo ready; while [ ! -e `+stop+` ]; do sleep 0.02; done`, func(c *Config) {
		c.Registry, c.Events, c.Replicas = reg, &ev, 1
	})
	r.waitLines(regexp.MustCompile(`ready`), 4)
	e := waitRegistered(t, reg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := jobstatus.Query(ctx, e, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeStop(stop); err != nil {
		t.Fatal(err)
	}
	r.wait()
	const want = "replicas:0"
	if s.Redundancy != want {
		t.Errorf("gorun status: redundancy %q, want %q", s.Redundancy, want)
	}
	recs, err := events.ReadAll(&ev)
	if err != nil || len(recs) == 0 {
		t.Fatalf("events: %v, %d records", err, len(recs))
	}
	if l, ok := recs[0].Event.(events.Launch); !ok || l.Redundancy != want {
		t.Errorf("launch record %+v, want redundancy %q", recs[0].Event, want)
	}
	if !strings.Contains(r.log.String(), `survives="`+want+` over 1 host`) {
		t.Errorf("-v does not say survives=%q over 1 host:\n%s", want, r.log.String())
	}
}

// TestRedundancyText: the redundancy in place, by what was placed, not
// by what was asked for; one function for status, events and -v.
func TestRedundancyText(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		rankHost []int
		holders  [][]int
		want     string
	}{
		{"one host, default replicas", Config{Replicas: 1}, []int{0, 0}, nil, "replicas:0"},
		{"none asked", Config{}, []int{0, 1}, nil, "replicas:0"},
		{"one replica", Config{Replicas: 1}, []int{0, 1}, [][]int{{1}, {0}}, "replicas:1"},
		{"a shortfall", Config{Replicas: 2}, []int{0, 1, 2}, [][]int{{1, 2}, {0, 2}, {0}}, "replicas:1"},
		{"ec", Config{ECK: 2, ECM: 1}, []int{0, 1, 2}, [][]int{{1}, nil, nil}, "ec:2+1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &job{cfg: tt.cfg, rankHost: tt.rankHost, holders: tt.holders, log: slog.New(slog.DiscardHandler)}
			if tt.cfg.ECK > 0 {
				j.ecGroups = []topology.ECGroup{{Hosts: []int{0, 1, 2}}}
			}
			if got := j.redundancyText(); got != tt.want {
				t.Errorf("redundancyText() = %q, want %q", got, tt.want)
			}
			if got := j.survives(); tt.cfg.ECK == 0 && !strings.HasPrefix(got, tt.want+" over") {
				t.Errorf("survives() = %q, want it to start %q", got, tt.want)
			}
		})
	}
}
