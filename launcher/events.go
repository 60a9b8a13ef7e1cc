package launcher

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/events"
)

// eventLog writes the job's record to --events FILE through an
// events.Writer: the schema, every kind and field, is package events'
// (internal/events/doc.go). The launcher writes launch when the job
// starts (recordLaunch), rendezvous and a sample every period while ranks
// run (recordProgress, every samplePeriod),
// a failure for each failure the machine decided on (recordFailed), the
// machine's decisions and recovery stages as it acts on them (do,
// timeline), and exit at the end (recordExit, after the open recovery
// epoch's timeline, unfinished, if one is under way).
//
// A nil *eventLog writes nothing. The first error writing is logged (a
// warning) and the log stops; the job goes on.
type eventLog struct {
	w    *events.Writer
	log  *slog.Logger
	once sync.Once
}

func newEventLog(w io.Writer, log *slog.Logger) *eventLog {
	return &eventLog{w: events.NewWriter(w), log: log}
}

// The record kinds the loop writes, by their older names here.
type (
	evFence     = events.Fence
	evSplice    = events.Splice
	evRestart   = events.Restart
	evPublish   = events.Publish
	evUnder     = events.UnderProtected
	evProtected = events.Protected
	evAbort     = events.Abort
	evTimeline  = events.Timeline
)

// record writes one record at at since the job started.
func (l *eventLog) record(at time.Duration, v events.Event) {
	if l == nil {
		return
	}
	if err := l.w.Write(at, v); err != nil {
		l.once.Do(func() { l.log.Warn("cannot write the --events record; it stops here", "err", err) })
	}
}

// timeline writes a recovery epoch's stages (at their times), then its
// record at now, when it ended (resumed, superseded, or unfinished at the
// job's end).
func (l *eventLog) timeline(t hotswap.Timeline, now time.Duration) {
	if l == nil {
		return
	}
	ats := []time.Duration{t.Detected, t.Classified, t.Replaced, t.Published, t.Restored, t.Resumed}
	for i, at := range ats {
		if at >= 0 {
			l.record(at, events.Stage{Name: events.Stages[i], Epoch: t.Epoch, Cause: t.Cause})
		}
	}
	at := func(d time.Duration) *float64 {
		if d < 0 {
			return nil
		}
		s := events.Seconds(d)
		return &s
	}
	l.record(max(now, slices.Max(ats)), evTimeline{Epoch: t.Epoch, Cause: t.Cause, Superseded: t.Superseded, Unfinished: t.Unfinished,
		Detected: at(t.Detected), Classified: at(t.Classified), Replaced: at(t.Replaced),
		Published: at(t.Published), Restored: at(t.Restored), Resumed: at(t.Resumed)})
}

// Err returns the first write error, if any.
func (l *eventLog) Err() error {
	if l == nil {
		return nil
	}
	return l.w.Err()
}

// recordLaunch writes the launch record: the job as it starts. The
// ranks' environment (-x, where secrets may be) is left out.
func (j *job) recordLaunch() {
	if j.evlog == nil {
		return
	}
	l := events.Launch{Schema: events.SchemaVersion, Job: j.id, NP: j.world,
		Hosts: make([]events.LaunchHost, len(j.hosts)), Protect: string(modeOrFull(j.cfg.ProtectMode)),
		Recovery: j.cfg.Recovery.String(), Program: append([]string{j.cfg.Prog}, j.cfg.Args...)}
	for i, h := range j.hosts {
		role := events.RoleRunning
		if h.spare {
			role = events.RoleSpare
			l.Spares++
		}
		l.Hosts[i] = events.LaunchHost{Name: h.name, Role: role, Ranks: append([]int{}, h.ranks...)}
	}
	l.Redundancy = j.redundancyText()
	j.evlog.record(0, l)
}

// samplePeriod is how often recordProgress samples a job of hosts hosts:
// 250 ms, and 10 ms per host beyond 25. A sample is some 50-60 bytes
// per host in a long job, so a running job writes at most some 6 KB of
// samples a second whatever its size (1 s at 100 hosts, 10 s at 1,000).
func samplePeriod(hosts int) time.Duration {
	return max(250*time.Millisecond, time.Duration(hosts)*10*time.Millisecond)
}

// recordProgress writes the rendezvous record once the first epoch table
// went out, then a sample every period in which the protection's figures
// changed, until ctx ends. It runs in its own goroutine.
func (j *job) recordProgress(ctx context.Context) {
	if j.evlog == nil {
		return
	}
	select {
	case <-j.rv.Done():
	case <-ctx.Done():
		return
	}
	j.evlog.record(j.since(), events.Rendezvous{Registered: j.rv.FirstRegistered(), Took: events.Seconds(j.since())})
	tick := time.NewTicker(samplePeriod(len(j.hosts)))
	defer tick.Stop()
	var last *events.Sample
	lastAt := j.since()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		now := j.since()
		s := j.prog.sample()
		if last != nil && s.G == last.G && s.Epoch == last.Epoch && s.Gen == last.Gen && slices.Equal(s.Stages, last.Stages) && slices.Equal(s.Min, last.Min) {
			continue
		}
		if last != nil && j.world > 0 && now > lastAt {
			var d int64
			for i := range s.Stages {
				if i < len(last.Stages) {
					d += max(s.Stages[i]-last.Stages[i], 0)
				}
			}
			s.Rate = float64(d) / float64(j.world) / (now - lastAt).Seconds()
		}
		j.evlog.record(now, s)
		last, lastAt = &s, now
	}
}

// sample is the protection's figures now, per host (events.Sample).
// O(ranks).
func (p *progress) sample() events.Sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.hostRanks)
	s := events.Sample{Epoch: p.epoch, Gen: p.gen, G: p.g, Min: make([]int64, n), Max: make([]int64, n),
		Wait: make([]float64, n), ReplBytes: make([]int64, n), Stages: make([]int64, n)}
	if g := p.global(); g.D != nil {
		d := *g.D
		s.D = &d
	}
	for h, rs := range p.hostRanks {
		s.Min[h], s.Max[h] = -1, -1
		var wait int64
		for i, r := range rs {
			x := p.ranks[r]
			if i == 0 || x.Committed < s.Min[h] {
				s.Min[h] = x.Committed
			}
			s.Max[h] = max(s.Max[h], x.Committed)
			wait += x.WaitNS
			s.ReplBytes[h] += x.ReplBytes
			s.Stages[h] += x.Stages
		}
		s.Wait[h] = float64(wait) / 1e9
	}
	return s
}

// recordFailed writes the failure record of a failure the machine
// decided on: one per incident, hangs and heartbeat or suspicion losses
// included (the machine finds those itself), with its reason.
func (j *job) recordFailed(a hotswap.Failed) {
	detected := events.Seconds(a.Detected)
	f := events.Failure{Host: a.Name, Rank: a.Rank, Msg: a.Why, Class: string(a.Class), Decision: string(a.Decision), Epoch: a.Epoch, Detected: &detected}
	switch a.Class {
	case hotswap.ClassRankExit:
		f.What = events.FailRankExit
		if a.Signal > 0 {
			f.Signal = hotswap.SignalName(a.Signal)
		} else {
			c := a.Code
			f.Exit = &c
		}
	case hotswap.ClassHang:
		f.What = events.FailHang
	case hotswap.ClassGPUPermanent:
		f.What = events.FailGPU
	default:
		f.What = events.FailHostLost
		if a.Agent {
			f.What = events.FailAgent
		}
	}
	j.evlog.record(j.since(), f)
}

// recordExit writes the exit record: code is gorun's exit code. A
// recovery epoch still under way is written first, unfinished, with the
// stages it reached.
func (j *job) recordExit(code int) {
	if j.m != nil {
		if tl, ok := j.m.OpenTimeline(); ok {
			j.evlog.timeline(tl, j.since())
		}
	}
	reason := ""
	if j.cause != nil {
		reason = j.cause.msg
	}
	if reason == "" && code > 128 && code < 128+65 {
		// A signal the machine stopped the job for (its StopRanks carries
		// no message): the exit record still says why.
		reason = "interrupted by " + hotswap.SignalName(syscall.Signal(code-128))
	}
	d := j.since()
	j.evlog.record(d, events.Exit{Code: code, Reason: reason, Duration: events.Seconds(d)})
}
