package launcher

import (
	"context"
	"fmt"
	"io"
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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape GETs url and parses the exposition with Prometheus's text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, res.Status, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parsing the exposition: %v\n%s", err, b)
	}
	return fams
}

// value is the value of family name's series with labels (name=value
// pairs); NaN if there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return math.NaN()
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return math.NaN()
}

// failureCounts is gorun_failures_total's series that are not 0, as
// "class/decision" → count.
func failureCounts(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams["gorun_failures_total"].GetMetric() {
		if v := m.GetCounter().GetValue(); v != 0 {
			var class, decision string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "class":
					class = l.GetValue()
				case "decision":
					decision = l.GetValue()
				}
			}
			out[class+"/"+decision] = v
		}
	}
	return out
}

// metricsJob is a job of 4 ranks on hosts a (0, 1) and b (2, 3) and a
// spare s, every agent registered, with metrics and a machine, fed by the test.
func metricsJob(t *testing.T) *job {
	t.Helper()
	j := &job{cfg: validConfig(), world: 4, rankHost: []int{0, 0, 1, 1}, rankEnded: make([]bool, 4), metrics: newMetrics()}
	for i, n := range []string{"a", "b", "s"} {
		h := &agentHost{index: i, name: n, topo: topology.Host{Name: n, Slots: 2, Spare: n == "s"}, spare: n == "s", registered: true}
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
	srv := httptest.NewServer(promhttp.HandlerFor(j.metrics.reg, promhttp.HandlerOpts{}))
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
		if f := fams[c.name]; f == nil || f.GetHelp() == "" {
			t.Errorf("%s has no help", c.name)
		}
	}
	if got := failureCounts(fams); !maps.Equal(got, map[string]float64{"rank-exit/restart": 1}) {
		t.Errorf("gorun_failures_total %v, want rank-exit/restart 1 alone", got)
	}
	if n := len(fams["gorun_failures_total"].GetMetric()); n != len(hotswap.FailureClasses())*len(hotswap.Decisions()) {
		t.Errorf("%d gorun_failures_total series, want one per class and decision made at the start", n)
	}
	if h := fams["gorun_recovery_duration_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleSum() != 0.5 {
		t.Errorf("recovery duration sum %v, want 0.5", h.GetSampleSum())
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
	var fams map[string]*dto.MetricFamily
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
			srv := httptest.NewServer(promhttp.HandlerFor(j.metrics.reg, promhttp.HandlerOpts{}))
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
			srv := httptest.NewServer(promhttp.HandlerFor(j.metrics.reg, promhttp.HandlerOpts{}))
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

// TestMetricsPrivateRegistry: gorun's metrics are on its own registry
// only, none on client_golang's default one (whose Go and process
// collectors the library itself registers at init): nothing of gorun's
// is exposed by, or costs anything in, the default registry.
func TestMetricsPrivateRegistry(t *testing.T) {
	m := newMetrics()
	if fams, err := m.reg.Gather(); err != nil || len(fams) == 0 {
		t.Fatalf("gorun's registry: %d families, %v", len(fams), err)
	}
	fams, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "gorun_") {
			t.Errorf("%s is on the default registry", f.GetName())
		}
	}
}
