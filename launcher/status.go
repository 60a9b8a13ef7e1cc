package launcher

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// gorun status (package jobstatus): the launcher serves a snapshot of the
// job on its control plane to the holder of the job's status credential,
// an nkey of its own (not derived from the job secret, and giving nothing
// but the status request: ctlserver.Config.StatusNkey), and registers the
// job in the user's registry so that `gorun status` finds it.
//
// The snapshot is built by the loop, which owns the state it reads, from
// copies, in O(hosts + ranks) (the loop serves one request at a time); the
// request's subscription decodes the request, waits a bounded time for
// the loop's copy, and encodes and sends it: a slow or stalled client
// costs the loop one copy, never a wait.

// statusWait bounds how long a status request waits for the loop.
const statusWait = 2 * time.Second

// statusReuse is how long a snapshot answers further requests of its
// kind without the loop; statusWarnEvery how often a bad status request
// may log a warning (the rest are counted, and said with the next).
const (
	statusReuse     = 100 * time.Millisecond
	statusWarnEvery = 10 * time.Second
)

// statusState is the job's status service; nil without one
// (Config.Registry "").
type statusState struct {
	kp   nkeys.KeyPair
	reqs chan statusReq // to the loop
	// failures are the recent failures, the newest last (the loop's).
	failures []jobstatus.Failure
	metrics  string // the metrics endpoint's URL, or ""

	// The request subscription's (onStatus, one request at a time):
	now        func() time.Time // the clock (tests)
	cached     [2]cachedStatus  // by statusReq.ranks
	warnedAt   time.Time        // the last bad request's warning
	suppressed int              // bad requests not logged since
}

// cachedStatus is an encoded snapshot and when it was taken.
type cachedStatus struct {
	at time.Time
	b  []byte
}

type statusReq struct {
	ranks bool
	out   chan *jobstatus.Snapshot // buffered, 1
}

// statusKey is the status credential's key pair, made by a goroutine of
// its own as Run begins: a process's first ed25519 key costs some 1.2 ms
// (crypto/ed25519 builds its base-point table), which then overlaps
// planning the job instead of delaying the control plane's start.
type statusKey struct {
	done chan struct{} // closed when kp and err are set
	kp   nkeys.KeyPair
	err  error
}

// newStatusKey starts making the status key pair; nil if !need.
func newStatusKey(need bool) *statusKey {
	if !need {
		return nil
	}
	k := &statusKey{done: make(chan struct{})}
	go func() {
		defer close(k.done)
		k.kp, k.err = nkeys.CreateUser()
	}()
	return k
}

// wait waits for the key pair (Run defers it: the goroutine never
// outlives Run).
func (k *statusKey) wait() (nkeys.KeyPair, error) {
	if k == nil {
		return nkeys.CreateUser()
	}
	<-k.done
	return k.kp, k.err
}

// statusInit makes the status credential (takes the key pair of
// j.statusKey) and admits it to the control plane about to start (scfg),
// if the job registers.
func (j *job) statusInit(scfg *ctlserver.Config) error {
	if j.cfg.Registry == "" {
		return nil
	}
	kp, err := j.statusKey.wait()
	if err != nil {
		return fmt.Errorf("launcher: status credential: %w", err)
	}
	if scfg.StatusNkey, err = kp.PublicKey(); err != nil {
		return fmt.Errorf("launcher: status credential: %w", err)
	}
	j.status = &statusState{kp: kp, reqs: make(chan statusReq)}
	return nil
}

// statusRequests is the loop's channel of status requests (nil: none).
func (j *job) statusRequests() <-chan statusReq {
	if j.status == nil {
		return nil
	}
	return j.status.reqs
}

// statusStart runs statusServe in a goroutine of its own, once the
// agents are being started: the status subscription's round trip and the
// registry entry's write (some 0.5 ms) are then off the launch's
// critical path. The function it returns waits for that goroutine and
// undoes what it did (every exit path of run defers it), so the entry
// goes whenever the job ends, even before it was written.
func (j *job) statusStart() (stop func()) {
	if j.status == nil {
		return func() {}
	}
	done := make(chan struct{})
	var undo func()
	go func() {
		defer close(done)
		s, err := j.statusServe()
		if err != nil {
			// gorun status will not reach the job; the job itself is fine.
			j.log.Warn("the job does not serve gorun status", "err", err)
			return
		}
		undo = s
	}()
	return func() {
		<-done
		if undo != nil {
			undo()
		}
	}
}

// statusServe answers status requests and registers the job, once the
// control plane is up; the function it returns undoes both.
func (j *job) statusServe() (stop func(), err error) {
	if j.status == nil {
		return func() {}, nil
	}
	sub, err := j.ctl.Subscribe(j.subj.Status(), j.onStatus)
	if err != nil {
		return nil, fmt.Errorf("launcher: status: %w", err)
	}
	if err := j.ctl.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("launcher: status: %w", err)
	}
	seed, err := j.status.kp.Seed()
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("launcher: status credential: %w", err)
	}
	e := &jobstatus.Entry{Job: j.id, PID: os.Getpid(), Start: time.Now(), Prog: j.cfg.Prog, URL: j.statusURL(), Seed: string(seed), MetricsURL: j.status.metrics}
	if fp := j.srv.Fingerprint(); fp != nil {
		e.Pin = hex.EncodeToString(fp)
	}
	if testHookRegister != nil {
		testHookRegister()
	}
	dir, unregister, err := jobstatus.RegisterFirst(append([]string{j.cfg.Registry}, j.cfg.RegistryFallback...), e)
	if err != nil {
		// gorun status will not find the job; the job itself is fine.
		j.log.Warn("the job is not registered for gorun status", "err", err)
		unregister = func() {}
	} else {
		j.log.Debug("registered for gorun status", "dir", dir, "url", e.URL)
	}
	return func() {
		unregister()
		_ = sub.Unsubscribe()
	}, nil
}

// testHookRegister, if set, runs before statusServe registers the job.
var testHookRegister func()

// statusURL is where a status client on this host dials the control
// plane: its listen address, or loopback for a wildcard.
func (j *job) statusURL() string {
	u, err := url.Parse(j.srv.URL())
	if err != nil {
		return j.srv.URL()
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return j.srv.URL()
	}
	if a, err := netip.ParseAddr(host); err == nil && a.IsUnspecified() {
		host = "127.0.0.1"
		if a.Is6() && !a.Is4In6() {
			host = "::1"
		}
	}
	if j.srv.Fingerprint() != nil {
		u.Scheme = "tls"
	}
	u.Host = net.JoinHostPort(host, port)
	return u.String()
}

// onStatus answers one status request (the subscription's goroutine, one
// at a time). A snapshot younger than statusReuse answers again: a
// client asking in a loop costs the loop one snapshot per statusReuse.
func (j *job) onStatus(m *nats.Msg) {
	st := j.status
	if !j.subj.StatusReplyAllowed(m.Reply) {
		st.warn(j.log, "status request with a reply subject outside the status inbox; dropped", "reply", m.Reply)
		return
	}
	r, err := wire.DecodeStatusRequest(m.Data)
	if err != nil {
		st.warn(j.log, "bad status request", "err", err)
		return
	}
	kind := 0
	if r.Ranks {
		kind = 1
	}
	c := &st.cached[kind]
	now := st.clock()
	if c.b == nil || now.Sub(c.at) >= statusReuse || now.Before(c.at) {
		b := j.askSnapshot(r.Ranks)
		if b == nil {
			return
		}
		*c = cachedStatus{at: now, b: b}
	}
	if err := m.Respond(c.b); err != nil {
		j.log.Debug("cannot answer a status request", "err", err)
	}
}

// askSnapshot asks the loop for a snapshot and encodes it; nil if the
// loop does not answer in time (the job is ending).
func (j *job) askSnapshot(ranks bool) []byte {
	req := statusReq{ranks: ranks, out: make(chan *jobstatus.Snapshot, 1)}
	t := time.NewTimer(statusWait)
	defer t.Stop()
	select {
	case j.status.reqs <- req:
	case <-t.C:
		return nil // the loop is past its end: the job is ending
	case <-j.quit:
		return nil
	}
	var s *jobstatus.Snapshot
	select {
	case s = <-req.out:
	case <-t.C:
		return nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil
	}
	return b
}

func (st *statusState) clock() time.Time {
	if st.now != nil {
		return st.now()
	}
	return time.Now()
}

// warn logs a bad status request, at most once per statusWarnEvery (a
// holder of the status credential must not flood the job's stderr),
// saying how many were not logged since the last.
func (st *statusState) warn(log *slog.Logger, msg string, args ...any) {
	now := st.clock()
	if !st.warnedAt.IsZero() && now.Sub(st.warnedAt) < statusWarnEvery && !now.Before(st.warnedAt) {
		st.suppressed++
		return
	}
	if st.suppressed > 0 {
		args = append(args, "suppressed", st.suppressed)
	}
	st.warnedAt, st.suppressed = now, 0
	log.Warn(msg, args...)
}

// answerStatus is the loop's part of a status request: the snapshot.
func (j *job) answerStatus(r statusReq) {
	r.out <- j.snapshot(r.ranks)
}

// snapshot is the job now, from copies (the loop's).
func (j *job) snapshot(ranks bool) *jobstatus.Snapshot {
	now := time.Now()
	s := &jobstatus.Snapshot{
		Version: jobstatus.Version, Job: j.id, PID: os.Getpid(), Prog: j.cfg.Prog, Args: slices.Clone(j.cfg.Args),
		Start: j.t0, Now: now, NP: j.world, Epoch: j.m.Epoch(), Gen: j.m.Gen(),
		Redundancy: j.redundancyText(), Protect: string(modeOrFull(j.cfg.ProtectMode)), Recovery: recoveryText(j.cfg.Recovery),
		Spares: []string{}, Failures: []jobstatus.Failure{},
	}
	switch {
	case j.stopping || j.m.Stopped():
		s.State = "stopping"
	case j.m.Recovering():
		s.State = "recovering"
	case !j.rvDone():
		s.State = "starting"
	default:
		s.State = "running"
	}
	if j.status != nil {
		s.MetricsURL = j.status.metrics
		s.Failures = append(s.Failures, j.status.failures...)
	}
	prog := j.prog.copyRanks()
	s.G = prog.g
	s.D = prog.d
	j.tab.RLock()
	defer j.tab.RUnlock()
	for _, h := range j.hosts {
		x := jobstatus.Host{Name: h.name, Addr: h.topo.Addr, NRanks: len(h.ranks), State: hostState(h)}
		if x.State == jobstatus.HostSpare {
			s.Spares = append(s.Spares, h.name)
		}
		if len(h.ranks) > 0 {
			rs := slices.Sorted(slices.Values(h.ranks))
			x.Ranks = jobstatus.Compact(rs)
			var c, p, d jobstatus.Range
			for i, r := range rs {
				rp := prog.ranks[r]
				dd := durableStep(rp)
				if i == 0 {
					c, p, d = jobstatus.Range{Min: rp.Committed, Max: rp.Committed}, jobstatus.Range{Min: rp.Replicated, Max: rp.Replicated}, jobstatus.Range{Min: dd, Max: dd}
					continue
				}
				c.Min, c.Max = min(c.Min, rp.Committed), max(c.Max, rp.Committed)
				p.Min, p.Max = min(p.Min, rp.Replicated), max(p.Max, rp.Replicated)
				d.Min, d.Max = min(d.Min, dd), max(d.Max, dd)
			}
			x.Committed, x.Replicated = &c, &p
			if j.cfg.Durable.Dir != "" {
				x.Durable = &d
			}
		}
		s.Hosts = append(s.Hosts, x)
	}
	if ranks {
		s.Ranks = make([]jobstatus.Rank, j.world)
		for r := range j.world {
			rp := prog.ranks[r]
			s.Ranks[r] = jobstatus.Rank{Rank: r, Host: j.hosts[j.rankHost[r]].name, Committed: rp.Committed, Replicated: rp.Replicated,
				Durable: durableStep(rp), WaitSeconds: float64(rp.WaitNS) / 1e9}
		}
	}
	return s
}

// hostState is h's state for gorun status and the metrics (the loop's):
// a spare is one left (HostSpare) only once registered and while not
// suspected; one whose agent could not start is lost.
func hostState(h *hostAgent) string {
	switch {
	case h.lost:
		return jobstatus.HostLost
	case len(h.ranks) > 0:
		return jobstatus.HostRunning
	case !h.spare:
		return jobstatus.HostFree
	case h.ended && !h.registered:
		return jobstatus.HostLost // its agent could not start
	case h.ended:
		return jobstatus.HostFree // its agent ended with the job
	case !h.registered:
		return jobstatus.HostStarting
	case h.probed.Load():
		return jobstatus.HostSuspected
	}
	return jobstatus.HostSpare
}

// durableStep is a rank's newest durable marker, -1 for none.
func durableStep(r wire.RankProgress) int64 {
	if r.D == nil || len(r.D.Markers) == 0 {
		return -1
	}
	return r.D.Markers[len(r.D.Markers)-1]
}

func (j *job) rvDone() bool {
	select {
	case <-j.rv.Done():
		return true
	default:
		return false
	}
}

// redundancyText describes the redundancy in place, not the one asked
// for: "ec:K+M", or "replicas:K" with K the fewest other hosts' copies
// any rank has (0 for a one-host job, whose default --replicas 1 has no
// host to go to). gorun status's snapshot, the events file's launch
// record and -v's "survives" all take it from here.
func (j *job) redundancyText() string {
	if j.cfg.ECK > 0 {
		return fmt.Sprintf("ec:%d+%d", j.cfg.ECK, j.cfg.ECM)
	}
	return fmt.Sprintf("replicas:%d", j.replicasInPlace())
}

// replicasInPlace is the fewest holders any rank has (j.holders).
func (j *job) replicasInPlace() int {
	k := -1
	for r := range j.rankHost {
		n := 0
		if r < len(j.holders) {
			n = len(j.holders[r])
		}
		if k < 0 || n < k {
			k = n
		}
	}
	return max(k, 0)
}

func recoveryText(r hotswap.Recovery) string { return r.String() }

// statusAction records, for the snapshot's failures, each failure the
// machine decided on (hotswap.Failed: its class, decision, epoch and
// reason, the events file's failure record's) and what became of it: the
// splice that moved its host's ranks, its epoch's timeline (called with
// each action, by the loop).
func (j *job) statusAction(a hotswap.Action) {
	j.metricsAction(a)
	if j.status == nil {
		return
	}
	st := j.status
	switch a := a.(type) {
	case hotswap.Failed:
		st.add(jobstatus.Failure{Epoch: a.Epoch, At: j.t0.Add(a.Detected), Class: string(a.Class), Decision: string(a.Decision),
			Why: a.Why, Host: a.Name, Rank: a.Rank, Done: a.Decision == hotswap.DecisionNone || a.Decision == hotswap.DecisionAbort})
	case hotswap.Splice:
		if f := st.spliced(a); f != nil {
			f.Epoch, f.With, f.Ranks, f.Spare = a.Epoch, a.WithName, jobstatus.Compact(slices.Sorted(slices.Values(a.Ranks))), a.Spare
		}
	case hotswap.Timeline:
		for i := range st.failures {
			f := &st.failures[i]
			if f.Epoch != a.Epoch {
				continue
			}
			f.Cause, f.Done, f.Superseded = a.Cause, true, a.Superseded
			if a.Detected >= 0 && a.Resumed >= 0 {
				d := (a.Resumed - a.Detected).Seconds()
				f.RecoverySeconds = &d
			}
		}
	case hotswap.Abort:
		// The job stops: nothing more comes of any failure (a loss
		// waiting for its replacement gets none, a recovery under way
		// does not resume).
		for i := range st.failures {
			st.failures[i].Done = true
		}
	}
}

// add records a failure, the newest (at most MaxFailures are kept).
func (st *statusState) add(f jobstatus.Failure) {
	if len(st.failures) == jobstatus.MaxFailures {
		st.failures = slices.Delete(st.failures, 0, 1)
	}
	st.failures = append(st.failures, f)
}

// spliced is the failure whose host's ranks splice a moves: the newest
// failure of host a.LostName that started a.Epoch, or that waited for a
// replacement (decision wait, no epoch yet); nil if none is kept.
func (st *statusState) spliced(a hotswap.Splice) *jobstatus.Failure {
	for i := len(st.failures) - 1; i >= 0; i-- {
		f := &st.failures[i]
		if f.Host == a.LostName && f.With == "" && (f.Epoch == a.Epoch || f.Epoch == 0 && f.Decision == string(hotswap.DecisionWait)) {
			return f
		}
	}
	return nil
}

// progressCopy is progress's figures at one moment.
type progressCopy struct {
	g     int64
	d     *int64
	ranks []wire.RankProgress // by rank; read only (D is shared)
}

// copyRanks copies the figures a snapshot shows: O(ranks).
func (p *progress) copyRanks() progressCopy {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.global()
	return progressCopy{g: p.g, d: g.D, ranks: slices.Clone(p.ranks)}
}
