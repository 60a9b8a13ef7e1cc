package launcher

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// metricsJob is a job of 4 ranks on hosts a (0, 1) and b (2, 3) and a
// spare s, every agent registered, with metrics and a machine, fed by the test.
func metricsJob(t *testing.T) *job {
	t.Helper()
	j := &job{cfg: validConfig(), world: 4, rankHost: []int{0, 0, 1, 1}, rankEnded: make([]bool, 4), metrics: newMetrics()}
	for i, n := range []string{"a", "b", "s"} {
		h := &hostAgent{index: i, name: n, topo: topology.Host{Name: n, Slots: 2, Spare: n == "s"}, spare: n == "s", registered: true}
		if n != "s" {
			h.ranks = []int{2 * i, 2*i + 1}
		}
		j.hosts = append(j.hosts, h)
	}
	var err error
	if j.m, err = hotswap.New(j.machineConfig()); err != nil {
		t.Fatal(err)
	}
	j.prog = newProgress([][]int{{0, 1}, {2, 3}, nil}, []int{0, 0, 1, 1}, func(*wire.GlobalStep) {})
	return j
}

// TestMetricsFigures: progress reports add their ranks' rise in wait and
// replication bytes to the counters (once: a report repeating figures
// adds nothing), G's rise counts steps, the gauges follow the hosts, and
// the machine's actions count failures (its Failed, by class and
// decision, each series there from the start) and recoveries.
func TestMetricsFigures(t *testing.T) {
	j := metricsJob(t)
	report := func(host int, step, waitMS, bytes int64) {
		u := &wire.UpProgress{Host: host}
		for _, r := range j.hosts[host].ranks {
			u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: step, Replicated: step, WaitNS: waitMS * 1e6, ReplBytes: bytes})
		}
		j.metricsProgress(u)
		if err := j.prog.handle(u); err != nil {
			t.Fatal(err)
		}
	}
	report(0, 4, 100, 1000)
	report(1, 4, 200, 3000)
	report(1, 4, 200, 3000) // the same again
	report(0, 6, 150, 1500)
	j.metricsTick()
	j.metricsAction(hotswap.Failed{Host: 1, Name: "b", Rank: 2, Class: hotswap.ClassRankExit, Decision: hotswap.DecisionRestart, Epoch: 1})
	j.metricsAction(hotswap.Restart{Gen: 1, Epoch: 1, G: 4})
	j.metricsAction(hotswap.Timeline{Epoch: 1, Detected: time.Second, Resumed: 1500 * time.Millisecond, Replaced: -1})
	srv := httptest.NewServer(j.metrics.set)
	defer srv.Close()
	fams := scrape(t, srv.URL)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gorun_global_step", nil, 4},
		{"gorun_steps_total", nil, 5}, // -1 → 4
		{"gorun_protection_wait_seconds_total", nil, 2 * (0.150 + 0.200)},
		{"gorun_replication_bytes_total", nil, 2 * (1500 + 3000)},
		{"gorun_hosts_up", nil, 2},
		{"gorun_ranks_up", nil, 4},
		{"gorun_spares_left", nil, 1},
		{"gorun_epoch", nil, 0},
		{"gorun_durable_step", nil, -1},
		{"gorun_failures_total", []string{"class", "rank-exit", "decision", "restart"}, 1},
		{"gorun_failures_total", []string{"class", "host-loss", "decision", "splice"}, 0},
		{"gorun_recoveries_total", nil, 1},
		{"gorun_recovery_duration_seconds", nil, 1}, // one observation
	} {
		if got := value(fams, c.name, c.labels...); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
		if f := fams[c.name]; f == nil || f.help == "" {
			t.Errorf("%s has no help", c.name)
		}
	}
	if got := failureCounts(fams); !maps.Equal(got, map[string]float64{"rank-exit/restart": 1}) {
		t.Errorf("gorun_failures_total %v, want rank-exit/restart 1 alone", got)
	}
	if n := fams["gorun_failures_total"].series(); n != len(hotswap.FailureClasses())*len(hotswap.Decisions()) {
		t.Errorf("%d gorun_failures_total series, want one per class and decision made at the start", n)
	}
	if sum := fams["gorun_recovery_duration_seconds"].histogramSum(); sum != 0.5 {
		t.Errorf("recovery duration sum %v, want 0.5", sum)
	}
}

// TestMetricsProgressHuge: a host's report whose figures, each valid
// (up to MaxInt64), sum past MaxInt64 adds their sum: it does not wrap
// below zero (a counter asked to fall panics, and the launcher with it).
func TestMetricsProgressHuge(t *testing.T) {
	j := metricsJob(t)
	u := &wire.UpProgress{Host: 0}
	for _, r := range j.hosts[0].ranks {
		u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, WaitNS: math.MaxInt64, ReplBytes: math.MaxInt64})
	}
	j.metricsProgress(u)
	srv := httptest.NewServer(j.metrics.set)
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if got, want := value(fams, "gorun_replication_bytes_total"), 2*float64(math.MaxInt64); got != want {
		t.Errorf("gorun_replication_bytes_total = %v, want %v", got, want)
	}
}

// TestMetricsEndpoint: --metrics :0 serves the endpoint on loopback, on a
// port gorun status shows, while the job runs, and stops with it.
func TestMetricsEndpoint(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg")
	stop := filepath.Join(t.TempDir(), "stop")
	r := startRun(t, 2, `echo ready; while [ ! -e `+stop+` ]; do sleep 0.02; done`, func(c *Config) { c.Registry, c.Metrics = reg, ":0" })
	r.waitLines(regexp.MustCompile(`ready`), 2)
	e := waitRegistered(t, reg)
	url := e.MetricsURL
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.HasPrefix(url, "http://127.0.0.1:0/") || !strings.HasSuffix(url, MetricsPath) {
		t.Fatalf("metrics URL %q, want loopback with the port picked", url)
	}
	// The gauges are set each tick (at most a second): poll.
	var fams map[string]*metricFamily
	for deadline := time.Now().Add(30 * time.Second); ; {
		fams = scrape(t, url)
		if value(fams, "gorun_ranks_up") == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := value(fams, "gorun_ranks_up"); v != 2 {
		t.Errorf("gorun_ranks_up = %v, want 2", v)
	}
	if v := value(fams, "gorun_hosts_up"); v != 1 {
		t.Errorf("gorun_hosts_up = %v, want 1", v)
	}
	for _, name := range []string{"gorun_global_step", "gorun_steps_total", "gorun_protection_wait_seconds_total", "gorun_replication_bytes_total",
		"gorun_failures_total", "gorun_recoveries_total", "gorun_recovery_duration_seconds", "gorun_spares_left", "gorun_durable_step"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := jobstatus.Query(ctx, e, false)
	if err != nil || s.MetricsURL != url {
		t.Errorf("status: %v, metrics URL %q; want %q", err, s.MetricsURL, url)
	}
	if err := writeStop(stop); err != nil {
		t.Fatal(err)
	}
	r.wait()
	if res, err := http.Get(url); err == nil {
		res.Body.Close()
		t.Errorf("the metrics endpoint still answers after the job")
	}
}

func TestMetricsAddr(t *testing.T) {
	for _, c := range []struct{ in, want string }{{":9400", "127.0.0.1:9400"}, {":0", "127.0.0.1:0"}, {"0.0.0.0:9400", "0.0.0.0:9400"}, {"[::1]:1", "[::1]:1"}} {
		if got, err := metricsAddr(c.in); err != nil || got != c.want {
			t.Errorf("metricsAddr(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"9400", "", "host"} {
		if _, err := metricsAddr(bad); err == nil {
			t.Errorf("metricsAddr(%q) accepted", bad)
		}
	}
}

// TestMetricsResumeSteps: a job resumed at step T (--resume) counts the
// steps it runs from T, not from -1: G going from -1 to T at once (the
// resume, before or after a tick) is no step run, and rate() over
// gorun_steps_total does not spike. Before the fix the counter jumped
// by T+1.
func TestMetricsResumeSteps(t *testing.T) {
	for _, tickFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("tick before the resume %v", tickFirst), func(t *testing.T) {
			j := metricsJob(t)
			if tickFirst {
				j.metricsTick()
			}
			j.prog.resumeAt(245)
			j.metricsTick()
			for h := range 2 {
				u := &wire.UpProgress{Host: h}
				for _, r := range j.hosts[h].ranks {
					u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: 250, Replicated: 250})
				}
				if err := j.prog.handle(u); err != nil {
					t.Fatal(err)
				}
			}
			j.metricsTick()
			srv := httptest.NewServer(j.metrics.set)
			defer srv.Close()
			fams := scrape(t, srv.URL)
			if g, n := value(fams, "gorun_global_step"), value(fams, "gorun_steps_total"); g != 250 || n != 5 {
				t.Errorf("G %v, steps %v; want 250 and 5 (resumed at 245)", g, n)
			}
		})
	}
}

// TestMetricsAfterRestart: a rank's protection wait and replication
// bytes count from 0 again in a new process (a restart, or a rank moved
// to a spare): its first report there adds all of its figures, even when
// they exceed the old process's last ones. Before the fix progress kept
// the old figures and only the difference was counted.
func TestMetricsAfterRestart(t *testing.T) {
	for _, how := range []string{"restart", "move"} {
		t.Run(how, func(t *testing.T) {
			j := metricsJob(t)
			report := func(host int, waitMS, bytes int64) {
				u := &wire.UpProgress{Host: host, Gen: j.gen}
				for _, r := range j.hosts[host].ranks {
					u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: 1, Replicated: 1, WaitNS: waitMS * 1e6, ReplBytes: bytes})
				}
				j.metricsProgress(u)
				if err := j.prog.handle(u); err != nil {
					t.Fatal(err)
				}
			}
			report(0, 100, 1000) // ranks 0 and 1
			switch how {
			case "restart":
				j.gen = 1
				j.prog.restart(1)
			case "move":
				j.prog.move([]int{0, 1}, 0, 2)
				j.hosts[2].ranks, j.hosts[0].ranks = j.hosts[0].ranks, nil
			}
			host := 0
			if how == "move" {
				host = 2
			}
			report(host, 150, 1500)
			srv := httptest.NewServer(j.metrics.set)
			defer srv.Close()
			fams := scrape(t, srv.URL)
			if got, want := value(fams, "gorun_protection_wait_seconds_total"), 2*(0.100+0.150); math.Abs(got-want) > 1e-9 {
				t.Errorf("wait %v, want %v", got, want)
			}
			if got, want := value(fams, "gorun_replication_bytes_total"), float64(2*(1000+1500)); got != want {
				t.Errorf("bytes %v, want %v", got, want)
			}
		})
	}
}

// TestMetricsExposedWarning: an endpoint on an address other than
// loopback warns that it serves the job's figures to the network without
// authentication; a loopback one does not.
func TestMetricsExposedWarning(t *testing.T) {
	for _, tt := range []struct {
		addr string
		warn bool
	}{{":0", false}, {"0.0.0.0:0", true}} {
		t.Run(tt.addr, func(t *testing.T) {
			r := startRun(t, 1, `true`, func(c *Config) { c.Metrics = tt.addr })
			r.wait()
			log := r.log.String()
			if got := strings.Contains(log, "level=WARN") && strings.Contains(log, "without authentication"); got != tt.warn {
				t.Errorf("--metrics %s: warned %v, want %v; log:\n%s", tt.addr, got, tt.warn, log)
			}
		})
	}
}

// TestMetricsPrivateSet: each job's metrics are its own, with no state
// shared between sets (there is no process-global registry): figures
// set on one are not seen in another.
func TestMetricsPrivateSet(t *testing.T) {
	a, b := newMetrics(), newMetrics()
	a.g.Set(7)
	a.failures.with("hang", "abort").Inc()
	fams, err := parseExposition(string(b.set.appendExposition(nil)))
	if err != nil {
		t.Fatal(err)
	}
	if g, n := value(fams, "gorun_global_step"), failureCounts(fams); g != -1 || len(n) != 0 {
		t.Errorf("a fresh set shows G %v and failures %v, want -1 and none", g, n)
	}
}

// TestMetricsFamilies: the endpoint's families, their types, labels and
// buckets, as the client_golang endpoint had them.
func TestMetricsFamilies(t *testing.T) {
	fams, err := parseExposition(string(newMetrics().set.appendExposition(nil)))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"gorun_global_step": "gauge", "gorun_epoch": "gauge", "gorun_durable_step": "gauge", "gorun_spares_left": "gauge",
		"gorun_hosts_up": "gauge", "gorun_ranks_up": "gauge", "gorun_steps_total": "counter",
		"gorun_protection_wait_seconds_total": "counter", "gorun_replication_bytes_total": "counter",
		"gorun_recoveries_total": "counter", "gorun_failures_total": "counter", "gorun_recovery_duration_seconds": "histogram",
	}
	got := map[string]string{}
	for n, f := range fams {
		got[n] = f.typ
	}
	if !maps.Equal(got, want) {
		t.Errorf("families %v, want %v", got, want)
	}
	var les []string
	for _, s := range fams["gorun_recovery_duration_seconds"].samples {
		if le, ok := s.labels["le"]; ok {
			les = append(les, le)
		}
	}
	if w := "0.05 0.1 0.2 0.4 0.8 1.6 3.2 6.4 12.8 25.6 51.2 102.4 +Inf"; strings.Join(les, " ") != w {
		t.Errorf("buckets le %v, want %s", les, w)
	}
	for _, s := range fams["gorun_failures_total"].samples {
		if len(s.labels) != 2 || s.labels["class"] == "" || s.labels["decision"] == "" {
			t.Errorf("gorun_failures_total labels %v, want class and decision", s.labels)
		}
	}
}
