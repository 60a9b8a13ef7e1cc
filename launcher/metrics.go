package launcher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/internal/wire"
)

// --metrics ADDR: a Prometheus endpoint (GET /metrics) on the launcher,
// in the text exposition format (version 0.0.4), written here (metricSet,
// below) rather than through client_golang, whose package init
// (its default registry's Go and process collectors, procfs, protobuf)
// every gorun paid at start whether it served metrics or not. The set is
// the job's own: there is no process-global one. The loop updates the
// figures (on progress reports, on the machine's actions, each tick);
// the HTTP server only reads them.
// No metric has a per-rank or per-host label: a job of 10,000 ranks has
// as many series as one of 2 (gorun_failures_total has a series per
// failure class and decision, 4 × 6, all made at the start).

// MetricsPath is the endpoint's path.
const MetricsPath = "/metrics"

type metrics struct {
	set *metricSet
	srv *http.Server
	url string
	wg  sync.WaitGroup // the server's goroutine

	g, epoch, d, spares, hostsUp, ranksUp *gauge
	steps, wait, replBytes, recoveries    *counter
	failures                              *counterVec
	recovery                              *histogram
	lastG                                 int64 // the loop's
}

func newMetrics() *metrics {
	s := &metricSet{}
	m := &metrics{set: s, lastG: -1}
	m.g = s.gauge("gorun_global_step", "G, the newest step every rank can resume from (-1: none yet).")
	m.epoch = s.gauge("gorun_epoch", "The job's epoch: one more per membership change.")
	m.d = s.gauge("gorun_durable_step", "D, the durable tier's watermark: the newest step committed on disk by every rank (-1: none).")
	m.spares = s.gauge("gorun_spares_left", "Idle spare hosts left to replace lost ones.")
	m.hostsUp = s.gauge("gorun_hosts_up", "Hosts running ranks.")
	m.ranksUp = s.gauge("gorun_ranks_up", "Ranks that have not ended in this generation.")
	m.steps = s.counter("gorun_steps_total", "Steps by which G rose: rate() is the job's step rate.")
	m.wait = s.counter("gorun_protection_wait_seconds_total", "Time ranks waited at the overwrite rule for their previous step to be recoverable everywhere, summed over ranks.")
	m.replBytes = s.counter("gorun_replication_bytes_total", "Bytes of protected state sent to replica holders, summed over ranks.")
	m.recoveries = s.counter("gorun_recoveries_total", "Recovery epochs that resumed every rank.")
	m.failures = s.counterVec("gorun_failures_total",
		"Failures the recovery state machine decided on, one per incident, by class (host-loss, rank-exit, hang, gpu-permanent) and decision (splice, restart, rollback, wait, abort, none).",
		"class", "decision")
	for _, c := range hotswap.FailureClasses() {
		for _, d := range hotswap.Decisions() {
			m.failures.with(string(c), string(d)) // 0 until the first: the series exist from the start
		}
	}
	m.recovery = s.histogram("gorun_recovery_duration_seconds", "Time from a failure's detection to every rank resumed.",
		exponentialBuckets(0.05, 2, 12))
	m.g.Set(-1)
	m.d.Set(-1)
	return m
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
	mux.Handle(MetricsPath, m.set)
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
	// Summed as floats: an int64 sum of a host's figures (each up to
	// MaxInt64, as a host may report) could wrap below zero, and a
	// counter that is asked to fall panics.
	var wait, bytes float64
	for _, r := range u.Ranks {
		if r.Rank < 0 || r.Rank >= j.world {
			continue
		}
		old := j.prog.rank(r.Rank)
		wait += float64(rise(old.WaitNS, r.WaitNS))
		bytes += float64(rise(old.ReplBytes, r.ReplBytes))
	}
	m.wait.Add(wait / 1e9)
	m.replBytes.Add(bytes)
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
		m.failures.with(string(a.Class), string(a.Decision)).Inc()
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

// The exposition. A metricSet holds the job's families and serves them
// (it is the endpoint's handler) as Prometheus's client_golang did: the
// text format 0.0.4, the families sorted by name, each with its HELP and
// TYPE lines, a family's series sorted by label values, a histogram's
// buckets cumulative with le ascending to +Inf, then its _sum and _count.
// Values are float64s, written as strconv's shortest 'g' form ("+Inf",
// "NaN" included), as client_golang wrote them. Updates are atomic (or
// under the family's lock); ServeHTTP reads a consistent value of each
// series, not a snapshot of the whole set.

// expositionType is the Content-Type of the text format.
const expositionType = "text/plain; version=0.0.4; charset=utf-8"

type metricSet struct {
	fams []family // in the order made; sorted by name when written
}

// family is one metric family: its series write themselves.
type family struct {
	name, help, typ string
	write           func(b []byte, name string) []byte
}

func (s *metricSet) add(name, help, typ string, write func([]byte, string) []byte) {
	for _, f := range s.fams {
		if f.name == name {
			panic("launcher: metric " + name + " made twice")
		}
	}
	s.fams = append(s.fams, family{name: name, help: help, typ: typ, write: write})
}

// atomicFloat is a float64 updated atomically.
type atomicFloat struct{ bits atomic.Uint64 }

func (a *atomicFloat) load() float64   { return math.Float64frombits(a.bits.Load()) }
func (a *atomicFloat) store(v float64) { a.bits.Store(math.Float64bits(v)) }
func (a *atomicFloat) add(v float64) {
	for {
		old := a.bits.Load()
		if a.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

type gauge struct{ v atomicFloat }

// Set sets the gauge to v.
func (g *gauge) Set(v float64) { g.v.store(v) }

func (s *metricSet) gauge(name, help string) *gauge {
	g := &gauge{}
	s.add(name, help, "gauge", func(b []byte, name string) []byte { return appendSample(b, name, "", g.v.load()) })
	return g
}

type counter struct{ v atomicFloat }

// Add adds v, which must not be negative: a counter only rises.
func (c *counter) Add(v float64) {
	if v < 0 {
		panic("launcher: counter cannot decrease in value")
	}
	c.v.add(v)
}

// Inc adds 1.
func (c *counter) Inc() { c.v.add(1) }

func (s *metricSet) counter(name, help string) *counter {
	c := &counter{}
	s.add(name, help, "counter", func(b []byte, name string) []byte { return appendSample(b, name, "", c.v.load()) })
	return c
}

// counterVec is a counter family with labels: a series per tuple of
// label values, made on first use.
type counterVec struct {
	labels []string
	mu     sync.Mutex
	series map[string]*counter // by label string ({a="x",b="y"})
}

// with returns the series of the label values vals (one per label),
// making it at 0 if it is new.
func (v *counterVec) with(vals ...string) *counter {
	if len(vals) != len(v.labels) {
		panic(fmt.Sprintf("launcher: %d label values for %d labels", len(vals), len(v.labels)))
	}
	var b []byte
	for i, l := range v.labels {
		b = appendLabel(b, i == 0, l, vals[i])
	}
	b = append(b, '}')
	k := string(b)
	v.mu.Lock()
	defer v.mu.Unlock()
	c, ok := v.series[k]
	if !ok {
		c = &counter{}
		v.series[k] = c
	}
	return c
}

func (s *metricSet) counterVec(name, help string, labels ...string) *counterVec {
	v := &counterVec{labels: labels, series: map[string]*counter{}}
	s.add(name, help, "counter", func(b []byte, name string) []byte {
		v.mu.Lock()
		keys := slices.Sorted(maps.Keys(v.series))
		vals := make([]float64, len(keys))
		for i, k := range keys {
			vals[i] = v.series[k].v.load()
		}
		v.mu.Unlock()
		for i, k := range keys {
			b = appendSample(b, name, k, vals[i])
		}
		return b
	})
	return v
}

// histogram counts observations into buckets with inclusive upper
// bounds, as client_golang's does.
type histogram struct {
	bounds []float64 // ascending; +Inf implicit
	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; the last is +Inf's
	sum    float64
}

// Observe counts v in the first bucket whose bound is at least v.
func (h *histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v)
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.mu.Unlock()
}

func (s *metricSet) histogram(name, help string, bounds []float64) *histogram {
	if !slices.IsSorted(bounds) || len(bounds) == 0 || math.IsInf(bounds[len(bounds)-1], 1) {
		panic("launcher: histogram " + name + ": bounds must ascend, without +Inf")
	}
	h := &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
	s.add(name, help, "histogram", func(b []byte, name string) []byte {
		h.mu.Lock()
		counts, sum := slices.Clone(h.counts), h.sum
		h.mu.Unlock()
		var cum uint64
		for i, n := range counts {
			cum += n
			le := math.Inf(1)
			if i < len(bounds) {
				le = bounds[i]
			}
			b = appendSample(b, name+"_bucket", string(appendLabel(nil, true, "le", formatFloat(le)))+"}", float64(cum))
		}
		b = appendSample(b, name+"_sum", "", sum)
		return appendSample(b, name+"_count", "", float64(cum))
	})
	return h
}

// exponentialBuckets returns n bounds, the first start, each factor
// times the one before.
func exponentialBuckets(start, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

// appendExposition appends the whole set in the text format.
func (s *metricSet) appendExposition(b []byte) []byte {
	fams := slices.SortedFunc(slices.Values(s.fams), func(a, b family) int { return strings.Compare(a.name, b.name) })
	for _, f := range fams {
		b = append(b, "# HELP "...)
		b = append(b, f.name...)
		b = append(b, ' ')
		b = append(b, helpEscaper.Replace(f.help)...)
		b = append(b, "\n# TYPE "...)
		b = append(b, f.name...)
		b = append(b, ' ')
		b = append(b, f.typ...)
		b = append(b, '\n')
		b = f.write(b, f.name)
	}
	return b
}

// ServeHTTP writes the exposition.
func (s *metricSet) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b := s.appendExposition(make([]byte, 0, 4096))
	w.Header().Set("Content-Type", expositionType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// appendLabel appends name="value" (escaped), opening the braces if first
// and otherwise a comma; the caller closes them.
func appendLabel(b []byte, first bool, name, value string) []byte {
	if first {
		b = append(b, '{')
	} else {
		b = append(b, ',')
	}
	b = append(b, name...)
	b = append(b, `="`...)
	b = append(b, labelEscaper.Replace(value)...)
	return append(b, '"')
}

// appendSample appends one sample line: name, its labels (as appendLabel
// made them, closed; "" for none) and v.
func appendSample(b []byte, name, labels string, v float64) []byte {
	b = append(b, name...)
	b = append(b, labels...)
	b = append(b, ' ')
	b = append(b, formatFloat(v)...)
	return append(b, '\n')
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
