package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/gpu"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/gordump"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// agentPkg prefixes the functions of this package in a goroutine dump.
const agentPkg = gordump.Module + "/internal/agent."

// TestRunLeavesNoGoroutine: once Run has returned, whatever ended it (an
// orderly exit, the launcher's stream ending, ctx cancelled, a setup that
// fails), no goroutine the agent started is left: the launcher watchers,
// the epoch-table feed, GPU discovery, the PMI servers, the ranks' waiters
// and output pumps, the rank sockets' servers, the sweeps. The launcher's
// stream is, as the in-process launcher's, a pipe the test closes only at
// its end (or to end the agent); or, as cmd/gorun's, a plain reader Run
// cannot close, whose watcher alone is left to its reader. Run does not
// reach its bound on the wait for them either: it would log that some
// were left running.
func TestRunLeavesNoGoroutine(t *testing.T) {
	for _, tt := range []struct {
		name  string
		plain bool                // the launcher's stream is a plain reader (cmd/gorun's bufio.Reader over stdin)
		spec  func(*wire.JobSpec) // when not nil, changes the job's spec
		cfg   func(*Config)       // when not nil, changes the agent's Config
		end   func(f *leakJob)    // nil: Run ends by itself
		want  error               // Run's error, by errors.Is; nil: none (errAnyError: any)
	}{
		{name: "exit", end: func(f *leakJob) { f.send(&wire.Control{Op: wire.OpExit}) }},
		{name: "launcher lost", end: func(f *leakJob) { f.pw.Close() }, want: ErrLauncherLost},
		{name: "ctx cancelled", end: func(f *leakJob) { f.cancel() }, want: context.Canceled},
		{name: "exit, plain reader", plain: true, end: func(f *leakJob) { f.send(&wire.Control{Op: wire.OpExit}) }},
		{name: "setup fails", spec: func(s *wire.JobSpec) { s.ProtectMode = "bogus" }, want: ErrJobSpec},
		{name: "setup fails, plain reader", plain: true, spec: func(s *wire.JobSpec) { s.ProtectMode = "bogus" }, want: ErrJobSpec},
		{
			// The ranks cannot start (two GPUs each, the host has one):
			// the agent reports the error and ends.
			name: "agent error", spec: func(s *wire.JobSpec) { s.GPUsPerRank = 2 }, want: errAnyError,
			cfg: func(c *Config) {
				c.discoverGPUs = func(context.Context, *agent) *hostGPUs {
					return &hostGPUs{devs: []gpu.Device{{Index: 0}}, binds: map[int]gpu.Binding{}}
				}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := goroutineIDs(t)
			f := newLeakJob(t, strings.NewReplacer(" ", "", ",", "").Replace(tt.name), tt.spec)
			var logs gortest.SyncBuffer
			f.cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
			if tt.cfg != nil {
				tt.cfg(&f.cfg)
			}
			var plain *plainStream
			if tt.plain {
				plain = &plainStream{r: bufio.NewReader(f.cfg.Launcher)}
				f.cfg.Launcher = plain
			}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				if tt.end != nil {
					f.waitStarted(2)
					tt.end(f)
				}
			}()
			err := Run(f.ctx, f.cfg)
			<-ended
			switch {
			case tt.want == nil && err != nil:
				t.Errorf("Run: %v, want nil", err)
			case tt.want == errAnyError:
				if err == nil {
					t.Error("Run: nil, want an error")
				}
			case tt.want != nil && !errors.Is(err, tt.want) && !errors.Is(context.Cause(f.ctx), tt.want):
				t.Errorf("Run: %v, want %v", err, tt.want)
			}
			if strings.Contains(logs.String(), "goroutines left running at exit") {
				t.Error("Run waited its bound for goroutines left running")
			}
			if plain != nil && plain.closed.Load() {
				t.Error("Run closed a launcher stream that is not a pipe (its Close need not end a Read)")
			}
			// The plain stream's watcher is left to its reader: it ends
			// when the test closes the stream.
			watcher := func(g gordump.Goroutine) bool {
				return plain != nil && slices.ContainsFunc(g.Funcs, func(fn string) bool { return strings.HasPrefix(fn, agentPkg+"(*agent).watchLauncher") })
			}
			for _, g := range agentLeftovers(t, before, watcher) {
				t.Errorf("goroutine left after Run returned:\n%s", g.Stack)
			}
		})
	}
}

// errAnyError, as a want of TestRunLeavesNoGoroutine, accepts any error.
var errAnyError = errors.New("any error")

// TestLateGPUDiscoveryClosed: a GPU discovery that finishes after the
// loop has ended (Run waits for it) has its result closed all the same:
// the in-process agent would otherwise leak the NVML backend.
func TestLateGPUDiscoveryClosed(t *testing.T) {
	f := newLeakJob(t, "lategpu", nil)
	b := &closeBackend{}
	looping := make(chan struct{})
	f.cfg.discoverGPUs = func(ctx context.Context, a *agent) *hostGPUs {
		close(looping)
		<-a.done // Run's end, after the loop's
		return &hostGPUs{backend: b, binds: map[int]gpu.Binding{}}
	}
	go func() {
		select {
		case <-looping:
			f.pw.Close() // the launcher is lost
		case <-f.ctx.Done():
		}
	}()
	if err := Run(f.ctx, f.cfg); !errors.Is(err, ErrLauncherLost) {
		t.Errorf("Run: %v, want %v", err, ErrLauncherLost)
	}
	if !b.closed.Load() {
		t.Error("the GPU backend discovered after the loop's end was not closed")
	}
}

// TestRunNamesGoroutinesLeft: a goroutine blocked where the agent cannot
// end it (a GPU discovery that hangs in the driver, ignoring ctx) holds
// Run up to goroutineWait, no longer; Run's warning then names it.
func TestRunNamesGoroutinesLeft(t *testing.T) {
	f := newLeakJob(t, "hunggpu", nil)
	var logs gortest.SyncBuffer
	f.cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), nil))
	looping, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	f.cfg.discoverGPUs = func(context.Context, *agent) *hostGPUs {
		close(looping)
		<-release
		return &hostGPUs{binds: map[int]gpu.Binding{}}
	}
	go func() {
		select {
		case <-looping:
			f.pw.Close() // the launcher is lost
		case <-f.ctx.Done():
		}
	}()
	if err := Run(f.ctx, f.cfg); !errors.Is(err, ErrLauncherLost) {
		t.Errorf("Run: %v, want %v", err, ErrLauncherLost)
	}
	var warning string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "goroutines left running at exit") {
			warning = line
		}
	}
	if !strings.Contains(warning, taskGPUDiscovery) {
		t.Errorf("Run's warning of goroutines left does not name the hung %s: %q", taskGPUDiscovery, warning)
	}
}

// plainStream is a launcher stream as cmd/gorun's (stdin), but an
// io.Closer whose Close does not end a Read in progress, as a blocking
// *os.File's: it records the Close.
type plainStream struct {
	r      io.Reader
	closed atomic.Bool
}

func (s *plainStream) Read(p []byte) (int, error) { return s.r.Read(p) }

func (s *plainStream) Close() error {
	s.closed.Store(true)
	return nil
}

// closeBackend is a gpu.Backend without devices that records its Close.
type closeBackend struct{ closed atomic.Bool }

func (b *closeBackend) Devices() []gpu.Device { return nil }

func (b *closeBackend) Watch(context.Context) (<-chan gpu.Event, error) {
	return nil, errors.New("closeBackend: no watch")
}

func (b *closeBackend) Close() error {
	b.closed.Store(true)
	return nil
}

// leakJob is one in-process agent's job with two ranks, for
// TestRunLeavesNoGoroutine: the test runs Run itself.
type leakJob struct {
	t       *testing.T
	ctx     context.Context
	cancel  context.CancelFunc
	l       *control.Control
	subj    wire.Subjects
	cfg     Config
	pw      *io.PipeWriter
	started chan int
}

func newLeakJob(t *testing.T, name string, spec func(*wire.JobSpec)) *leakJob {
	t.Helper()
	job := uniqueJob("leak" + name)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	l, creds, dial := testControlPlane(t, ctx, job)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	f := &leakJob{t: t, ctx: ctx, cancel: cancel, l: l, subj: wire.JobSubjects(job), pw: pw, started: make(chan int, 16)}
	sub, err := l.Subscribe(f.subj.ForHost(0).Events, func(m *nats.Msg) {
		if e, err := wire.DecodeEvent(m.Data); err == nil && e.Kind == wire.EventStarted {
			f.started <- e.Rank
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	js := &wire.JobSpec{
		Prog: "sleep", Args: []string{"3600"}, Dir: t.TempDir(),
		KillGrace: time.Second, HeartbeatInterval: time.Second, StdinRank: wire.NoStdin,
	}
	if spec != nil {
		spec(js)
	}
	rv, err := control.StartRendezvous(l.Conn, job, 0, []control.RendezvousHost{{Name: "h0", Ranks: []int{0, 1}}}, js, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rv.Close)
	f.cfg = Config{Job: job, Host: 0, Name: "h0", Creds: creds, Dial: dial, Addr: "127.0.0.1", Launcher: pr, Logger: testLogger(t)}
	return f
}

// waitStarted waits for n ranks' start (or the test's end).
func (f *leakJob) waitStarted(n int) {
	for range n {
		select {
		case <-f.started:
		case <-f.ctx.Done():
			return
		}
	}
}

func (f *leakJob) send(c *wire.Control) {
	if err := f.l.Publish(f.subj.Control, wire.Marshal(c)); err != nil {
		f.t.Error(err)
	}
	if err := f.l.Flush(); err != nil {
		f.t.Error(err)
	}
}

// goroutineIDs returns the ids of the goroutines running now.
func goroutineIDs(t *testing.T) map[int]bool {
	t.Helper()
	gs, err := gordump.Parse(gordump.Take())
	if err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for _, g := range gs {
		ids[g.ID] = true
	}
	return ids
}

// agentLeftovers returns the goroutines running this package's code (not
// the tests') that are not in before, nor ignored. A goroutine that has done its work
// may still be on its way out when Run returns (its group's Done is its
// last call): they are looked for again each time the number of
// goroutines changes, up to a few seconds, as gordump.Write does; a
// goroutine left blocked is still there then.
func agentLeftovers(t *testing.T, before map[int]bool, ignore func(gordump.Goroutine) bool) []gordump.Goroutine {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		gs, err := gordump.Parse(gordump.Take())
		if err != nil {
			t.Fatal(err)
		}
		var left []gordump.Goroutine
		for _, g := range gs[1:] {
			if !before[g.ID] && runsAgent(g) && !ignore(g) {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		for runtime.NumGoroutine() == n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling the count: nothing to wait on
		}
	}
}

// runsAgent says whether g has a frame, or a creator, in this package's
// code other than its tests'.
func runsAgent(g gordump.Goroutine) bool {
	for _, f := range g.Funcs {
		if rest, ok := strings.CutPrefix(f, agentPkg); ok && !strings.HasPrefix(rest, "Test") && !strings.HasPrefix(rest, "(*leakJob)") {
			return true
		}
	}
	return false
}
