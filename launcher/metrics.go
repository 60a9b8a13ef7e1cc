package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// --metrics ADDR: a Prometheus endpoint (GET /metrics) on the launcher,
// through client_golang, with a registry of the job's own (not the
// process-global one). The loop updates the figures (on progress reports,
// on the machine's actions, each tick); the HTTP server only reads them.
// No metric has a per-rank or per-host label: a job of 10,000 ranks has
// as many series as one of 2 (gorun_failures_total has a series per
// failure class and decision, 4 × 6, all made at the start).

// MetricsPath is the endpoint's path.
const MetricsPath = "/metrics"

type metrics struct {
	reg *prometheus.Registry
	srv *http.Server
	url string
	wg  sync.WaitGroup // the server's goroutine

	g, epoch, d, spares, hostsUp, ranksUp prometheus.Gauge
	steps, wait, replBytes, recoveries    prometheus.Counter
	failures                              *prometheus.CounterVec
	recovery                              prometheus.Histogram
	lastG                                 int64 // the loop's
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), lastG: -1}
	f := promauto(m.reg)
	m.g = f.gauge("gorun_global_step", "G, the newest step every rank can resume from (-1: none yet).")
	m.epoch = f.gauge("gorun_epoch", "The job's epoch: one more per membership change.")
	m.d = f.gauge("gorun_durable_step", "D, the durable tier's watermark: the newest step committed on disk by every rank (-1: none).")
	m.spares = f.gauge("gorun_spares_left", "Idle spare hosts left to replace lost ones.")
	m.hostsUp = f.gauge("gorun_hosts_up", "Hosts running ranks.")
	m.ranksUp = f.gauge("gorun_ranks_up", "Ranks that have not ended in this generation.")
	m.steps = f.counter("gorun_steps_total", "Steps by which G rose: rate() is the job's step rate.")
	m.wait = f.counter("gorun_protection_wait_seconds_total", "Time ranks waited at the overwrite rule for their previous step to be recoverable everywhere, summed over ranks.")
	m.replBytes = f.counter("gorun_replication_bytes_total", "Bytes of protected state sent to replica holders, summed over ranks.")
	m.recoveries = f.counter("gorun_recoveries_total", "Recovery epochs that resumed every rank.")
	m.failures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorun_failures_total",
		Help: "Failures the recovery state machine decided on, one per incident, by class (host-loss, rank-exit, hang, gpu-permanent) and decision (splice, restart, rollback, wait, abort, none)."},
		[]string{"class", "decision"})
	m.reg.MustRegister(m.failures)
	for _, c := range hotswap.FailureClasses() {
		for _, d := range hotswap.Decisions() {
			m.failures.WithLabelValues(string(c), string(d)) // 0 until the first: the series exist from the start
		}
	}
	m.recovery = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorun_recovery_duration_seconds", Help: "Time from a failure's detection to every rank resumed.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 12)})
	m.reg.MustRegister(m.recovery)
	m.g.Set(-1)
	m.d.Set(-1)
	return m
}

type factory struct{ reg *prometheus.Registry }

func promauto(reg *prometheus.Registry) factory { return factory{reg} }

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

// metricsAddr resolves --metrics ADDR: a missing host is loopback.
func metricsAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", &ConfigError{Msg: fmt.Sprintf("--metrics %q: want HOST:PORT or :PORT (%v)", addr, err), Err: err}
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// ListenMetrics opens the listener of --metrics ADDR: a ConfigError for
// an ADDR that is not one, an error naming it when it cannot listen (a
// port in use).
func ListenMetrics(addr string) (net.Listener, error) {
	a, err := metricsAddr(addr)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", a)
	if err != nil {
		return nil, fmt.Errorf("launcher: --metrics %s: %w", addr, err)
	}
	return l, nil
}

// metricsStart starts the endpoint (--metrics), if asked; metricsStop
// shuts it down.
func (j *job) metricsStart() error {
	l := j.cfg.MetricsListener
	if l == nil && j.cfg.Metrics == "" {
		return nil
	}
	if l == nil {
		var err error
		if l, err = ListenMetrics(j.cfg.Metrics); err != nil {
			return err
		}
	}
	m := newMetrics()
	mux := http.NewServeMux()
	mux.Handle(MetricsPath, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: nil, Timeout: 5 * time.Second}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second}
	m.url = "http://" + l.Addr().String() + MetricsPath
	m.wg.Go(func() {
		if err := m.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			j.log.Warn("the metrics endpoint stopped", "err", err)
		}
	})
	j.metrics = m
	if j.status != nil {
		j.status.metrics = m.url
	}
	j.log.Debug("metrics endpoint up", "url", m.url)
	if a, ok := l.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		j.log.Warn("--metrics serves the job's figures (steps, failures, hosts, spares) to whoever reaches it, without authentication", "url", m.url)
	}
	return nil
}

func (j *job) metricsStop() {
	m := j.metrics
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := m.srv.Shutdown(ctx); err != nil {
		_ = m.srv.Close()
	}
	m.wg.Wait()
}

// metricsProgress counts what a progress report adds to the job's
// protection wait and replication bytes: the rise of each rank's
// figures since its last report (a figure that went down started again,
// in a new generation: all of it is new). Called by the loop before the
// report is taken in.
func (j *job) metricsProgress(u *wire.UpProgress) {
	m := j.metrics
	if m == nil || u.Gen != j.gen {
		return
	}
	var wait, bytes int64
	for _, r := range u.Ranks {
		if r.Rank < 0 || r.Rank >= j.world {
			continue
		}
		old := j.prog.rank(r.Rank)
		wait += rise(old.WaitNS, r.WaitNS)
		bytes += rise(old.ReplBytes, r.ReplBytes)
	}
	m.wait.Add(float64(wait) / 1e9)
	m.replBytes.Add(float64(bytes))
}

func rise(old, now int64) int64 {
	if now >= old {
		return now - old
	}
	return max(now, 0)
}

// metricsAction counts failures (each hotswap.Failed, under its class and
// decision: the events file's and gorun status's) and recoveries (from
// statusAction).
func (j *job) metricsAction(a hotswap.Action) {
	m := j.metrics
	if m == nil {
		return
	}
	switch a := a.(type) {
	case hotswap.Failed:
		m.failures.WithLabelValues(string(a.Class), string(a.Decision)).Inc()
	case hotswap.Timeline:
		if a.Resumed >= 0 && a.Detected >= 0 {
			m.recoveries.Inc()
			m.recovery.Observe((a.Resumed - a.Detected).Seconds())
		}
	}
}

// metricsTick sets the gauges (the loop, each tick).
func (j *job) metricsTick() {
	m := j.metrics
	if m == nil {
		return
	}
	if t, ok := j.prog.takeResumed(); ok {
		// A resumed job's G starts at the step it resumed from: the
		// steps before it ran in an earlier process.
		m.lastG = max(m.lastG, t)
	}
	g := j.prog.G()
	if g > m.lastG {
		m.steps.Add(float64(g - m.lastG))
	}
	m.lastG = g // down on a roll-back: the steps run again count again
	m.g.Set(float64(g))
	m.epoch.Set(float64(j.m.Epoch()))
	if d, _ := j.prog.durable(); d != nil {
		m.d.Set(float64(*d))
	}
	spares, up := 0, 0
	for _, h := range j.hosts {
		switch hostState(h) {
		case jobstatus.HostRunning:
			up++
		case jobstatus.HostSpare:
			spares++
		}
	}
	m.spares.Set(float64(spares))
	m.hostsUp.Set(float64(up))
	m.ranksUp.Set(float64(j.world - j.ranksEnded))
}
