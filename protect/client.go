package protect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/protecthook"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/replay"
)

// ErrNotUnderGorun: GORUN_SOCKET is not set.
var ErrNotUnderGorun = errors.New("rank: not started by gorun (GORUN_SOCKET is not set)")

// ServiceError is a request the rank service refused (PROTOCOL.md: an
// answer with "err").
type ServiceError struct {
	Op  string
	Msg string
}

func (e *ServiceError) Error() string { return "rank: " + e.Op + ": " + e.Msg }

// Options configure a Client.
type Options struct {
	// Socket is the rank socket; "" means $GORUN_SOCKET.
	Socket string
	// Gradient asks for a gradient buffer of that many float32 elements
	// (Client.Gradient). With Optimizer set and Gradient 0, the buffer
	// holds Optimizer.N elements.
	Gradient int64
	// Optimizer declares the rank's replay optimizer state (see
	// Optimizer): required when the job runs gorun --protect-mode diff.
	Optimizer *Optimizer
}

// Client is a rank's connection to its rank service. Stage, Wait and
// Gradient are meant for the trainer's main goroutine; Status may be
// called from any.
type Client struct {
	conn    net.Conn
	mu      sync.Mutex // one request at a time
	job     string
	rank    int
	files   []RegionFile
	index   map[string]int
	views   [2][][]byte
	unmaps  []func() error
	grad    [2][]byte // the gradient buffer's halves (ping-pong by step parity)
	welcome ProtectWelcome
	// dep are the halves' deposit areas (internal/keeper/localpeer.go), or nil.
	dep [2][]byte

	depMu   sync.Mutex   // guards depPlan (the background staging updates it)
	depPlan *DepositPlan // the newest deposit plan the service gave
	// depStep, depVer: the step Deposits was last asked for, and the
	// plan version it answered (for that step's Gradient).
	depStep int64
	depVer  uint64

	pending     chan error // the staging in flight, or nil
	pendingStep int64      // its step
	stats       Stats
}

// Stats are a client's counters.
type Stats struct {
	Stages   int64         // steps staged and committed
	RuleWait time.Duration // waited at the overwrite rule (inside the background staging)
	Copy     time.Duration // copying into the slots (in the background)
	Commit   time.Duration // the service's checksum and commit
	Wait     time.Duration // the trainer blocked in Wait
}

// Connect opens a session with the rank service and declares the rank's
// regions. A restarted rank must declare the regions it declared before.
func Connect(ctx context.Context, regions []Region, opt Options) (*Client, error) {
	path := opt.Socket
	if path == "" {
		path = os.Getenv(wire.EnvSocket)
	}
	if path == "" {
		return nil, ErrNotUnderGorun
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("rank: %w", err)
	}
	c := &Client{conn: conn, index: map[string]int{}}
	if err := c.handshake(ctx, regions, opt); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) handshake(ctx context.Context, regions []Region, opt Options) error {
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := wire.WriteSock(c.conn, wire.SockHello, &wire.Hello{Version: wire.SockVersion, Pid: os.Getpid()}); err != nil {
		return fmt.Errorf("rank: hello: %w", err)
	}
	var w wire.Welcome
	if err := c.read(wire.SockWelcome, &w); err != nil {
		return fmt.Errorf("rank: hello: %w", err)
	}
	c.job, c.rank = w.Job, w.Rank
	var pw ProtectWelcome
	hello := &ProtectHello{Version: Version, Regions: regions, Gradient: opt.Gradient, Optimizer: opt.Optimizer}
	if hello.Gradient == 0 && opt.Optimizer != nil {
		hello.Gradient = opt.Optimizer.N
	}
	if err := c.call(TypeProtectHello, hello, TypeProtectWelcome, &pw); err != nil {
		return err
	}
	if pw.Err != "" {
		return &ServiceError{"protect", pw.Err}
	}
	if len(pw.Regions) != len(regions) {
		return fmt.Errorf("rank: the service answered %d regions for %d", len(pw.Regions), len(regions))
	}
	c.welcome = pw
	c.files = pw.Regions
	for i := range c.views {
		c.views[i] = make([][]byte, len(pw.Regions))
	}
	for i, f := range pw.Regions {
		if f.Name != regions[i].Name || f.Size != regions[i].Size {
			return fmt.Errorf("rank: the service answered region %q of %d bytes for %q of %d", f.Name, f.Size, regions[i].Name, regions[i].Size)
		}
		v, unmap, err := ckpt.MapData(ckpt.RegionFile{Name: f.Name, Size: f.Size, Stride: f.Stride, Path: f.Path})
		if err != nil {
			return fmt.Errorf("rank: %w", err)
		}
		c.unmaps = append(c.unmaps, unmap)
		c.views[0][i], c.views[1][i] = v[0], v[1]
		c.index[f.Name] = i
	}
	if g := pw.Gradient; g != nil {
		stride := g.Stride
		if stride == 0 { // an older service: one half
			stride = (g.Size + 4095) &^ 4095
		}
		size := g.Size
		if g.Reduced > 0 {
			if g.Deposit < g.Size || g.Reduced > MaxGradient {
				return fmt.Errorf("rank: gradient buffer of %d bytes with deposits of %d elements at %d", g.Size, g.Reduced, g.Deposit)
			}
			size = g.Deposit + 4*g.Reduced
		}
		if stride < size {
			return fmt.Errorf("rank: gradient buffer of %d bytes with a stride of %d", size, stride)
		}
		v, unmap, err := ckpt.MapData(ckpt.RegionFile{Name: GradientRegion, Size: size, Stride: stride, Path: g.Path})
		if err != nil {
			return fmt.Errorf("rank: gradient buffer: %w", err)
		}
		c.unmaps = append(c.unmaps, unmap)
		c.grad = [2][]byte{v[0][:g.Size], v[1][:g.Size]}
		if g.Stride == 0 {
			c.grad[1] = c.grad[0]
		}
		if g.Reduced > 0 {
			c.dep = [2][]byte{v[0][g.Deposit:size], v[1][g.Deposit:size]}
			c.depPlan, c.depStep = pw.Deposits, NoStep
		}
	}
	return nil
}

// read reads frames until one of type want (skipping epoch pushes) and
// decodes it into v.
func (c *Client) read(want byte, v any) error {
	for {
		typ, b, err := wire.ReadSock(c.conn)
		if err != nil {
			return err
		}
		switch typ {
		case wire.SockEpoch:
			continue
		case wire.SockError:
			var e wire.SockErr
			if err := wire.DecodeSock(b, &e); err != nil {
				return err
			}
			return fmt.Errorf("refused by the rank service: %s", e.Err)
		case want:
			return wire.DecodeSock(b, v)
		default:
			return fmt.Errorf("unexpected message type %d (want %d)", typ, want)
		}
	}
}

// call sends a request and reads its answer.
func (c *Client) call(typ byte, req any, want byte, resp any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := wire.WriteSock(c.conn, typ, req); err != nil {
		return fmt.Errorf("rank: %w", err)
	}
	if err := c.read(want, resp); err != nil {
		return fmt.Errorf("rank: %w", err)
	}
	return nil
}

// Rank is the rank's number; Job the job id.
func (c *Client) Rank() int   { return c.rank }
func (c *Client) Job() string { return c.job }

// Replicas is how many other hosts hold copies of the replicated regions.
func (c *Client) Replicas() int { return c.welcome.Replicas }

// Restored is the state a rank resumes from.
type Restored struct {
	Step int64 // -1: nothing to restore (a fresh start)
	Tier int   // 1: this host's slots; 2: other hosts
	// Regions are read-only views of the restored slot, by name. They
	// stay valid until the second Stage after Restore: copy them out.
	Regions map[string][]byte
}

// Restore asks for the step to resume from (the globally recoverable step
// G) and returns its regions. A rank calls it once, before staging.
func (c *Client) Restore(ctx context.Context) (*Restored, error) {
	if err := c.Wait(ctx); err != nil {
		return nil, err
	}
	var r Restorable
	if err := c.callCtx(ctx, TypeRestore, &Empty{}, TypeRestorable, &r); err != nil {
		return nil, err
	}
	if r.Err != "" {
		return nil, &ServiceError{"restore", r.Err}
	}
	out := &Restored{Step: r.Step, Tier: r.Tier}
	if r.Step < 0 {
		return out, nil
	}
	if r.Slot != 0 && r.Slot != 1 {
		return nil, fmt.Errorf("rank: restore: slot %d", r.Slot)
	}
	out.Regions = map[string][]byte{}
	for i, f := range c.files {
		out.Regions[f.Name] = c.views[r.Slot][i]
	}
	return out, nil
}

func (c *Client) callCtx(ctx context.Context, typ byte, req any, want byte, resp any) error {
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	err := c.call(typ, req, want, resp)
	if !stop() {
		return fmt.Errorf("rank: %w", ctx.Err())
	}
	return err
}

// Stage protects step: in the background, it waits for the overwrite
// rule, copies each region's parts (concatenated, exactly the region's
// size) into the staging slot and commits. The parts must not change until
// Wait returns; Wait before the next optimizer step. Stage first waits for
// the staging before it (ctx bounds that wait only).
func (c *Client) Stage(ctx context.Context, step int64, data map[string][][]byte) error {
	if err := c.Wait(ctx); err != nil {
		return err
	}
	if err := CheckStep(step); err != nil {
		return fmt.Errorf("rank: stage: %w", err)
	}
	if len(data) != len(c.files) {
		return fmt.Errorf("rank: stage: %d regions given, %d declared", len(data), len(c.files))
	}
	for _, f := range c.files {
		parts, ok := data[f.Name]
		if !ok {
			return fmt.Errorf("rank: stage: region %q missing", f.Name)
		}
		var n int64
		for _, p := range parts {
			n += int64(len(p))
		}
		if n != f.Size {
			return fmt.Errorf("rank: stage: region %q: %d bytes given, its size is %d", f.Name, n, f.Size)
		}
	}
	done := make(chan error, 1)
	c.pending, c.pendingStep = done, step
	go func() { done <- c.stage(step, data) }()
	return nil
}

func (c *Client) stage(step int64, data map[string][][]byte) error {
	var sr Staged
	if err := c.call(TypeStage, &StepReq{Step: step}, TypeStaged, &sr); err != nil {
		return err
	}
	if sr.Err != "" {
		return &ServiceError{"stage", sr.Err}
	}
	if sr.Slot != 0 && sr.Slot != 1 || sr.Step != step {
		return fmt.Errorf("rank: stage: the service answered slot %d step %d", sr.Slot, sr.Step)
	}
	if sr.Deposits != nil {
		c.depMu.Lock()
		c.depPlan = sr.Deposits
		c.depMu.Unlock()
	}
	t0 := time.Now()
	var jobs []copyJob
	for i, f := range c.files {
		dst := c.views[sr.Slot][i]
		for _, p := range data[f.Name] {
			jobs = append(jobs, copyJob{dst[:len(p)], p})
			dst = dst[len(p):]
		}
	}
	parallelCopy(jobs)
	if h := protecthook.Staged; h != nil {
		h(step)
	}
	t1 := time.Now()
	var cr Committed
	if err := c.call(TypeCommit, &StepReq{Step: step}, TypeCommitted, &cr); err != nil {
		return err
	}
	if cr.Err != "" {
		return &ServiceError{"commit", cr.Err}
	}
	c.stats.Stages++
	c.stats.RuleWait += time.Duration(sr.WaitNS)
	c.stats.Copy += t1.Sub(t0)
	c.stats.Commit += time.Since(t1)
	return nil
}

type copyJob struct{ dst, src []byte }

// copyChunk is the unit the background copy is split into.
const copyChunk = 8 << 20

// parallelCopy copies on up to GOMAXPROCS goroutines (one core copies at
// a fraction of the memory bandwidth).
func parallelCopy(jobs []copyJob) {
	var chunks []copyJob
	var total int
	for _, j := range jobs {
		for off := 0; off < len(j.src); off += copyChunk {
			end := min(off+copyChunk, len(j.src))
			chunks = append(chunks, copyJob{j.dst[off:end], j.src[off:end]})
		}
		total += len(j.src)
	}
	workers := min(runtime.GOMAXPROCS(0), len(chunks))
	if workers <= 1 || total < 2*copyChunk {
		for _, ch := range chunks {
			copy(ch.dst, ch.src)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan copyJob)
	for range workers {
		wg.Go(func() {
			for ch := range next {
				copy(ch.dst, ch.src)
			}
		})
	}
	for _, ch := range chunks {
		next <- ch
	}
	close(next)
	wg.Wait()
}

// Wait waits for the staging in flight, if any, and returns its error.
// If ctx ends first, the session is closed (the staging cannot be taken
// back half done) and the Client is unusable from then on.
func (c *Client) Wait(ctx context.Context) error {
	if c.pending == nil {
		return nil
	}
	t := time.Now()
	var err error
	select {
	case err = <-c.pending:
	case <-ctx.Done():
		c.conn.Close() // ends the background staging's request
		<-c.pending
		err = fmt.Errorf("rank: %w", context.Cause(ctx))
	}
	c.pending = nil
	c.stats.Wait += time.Since(t)
	return err
}

// Stats returns the client's counters (call it between Wait and Stage).
func (c *Client) Stats() Stats { return c.stats }

// Mode is the job's protect mode. In ModeDiff the rank calls Gradient
// with the input of its optimizer step before it commits the step.
func (c *Client) Mode() ProtectMode { return cmp.Or(c.welcome.Mode, ModeFull) }

// GradientBuffer returns the half of the shared gradient buffer that
// holds step's gradient (half step mod 2; Options.Gradient elements, nil
// without a buffer). A trainer that computes or reduces its gradient of
// step into it saves Gradient's copy. It may write it once Wait returned
// for the staging of step-2 (Stage(step-1) waits for it): until then the
// service may still read that half.
func (c *Client) GradientBuffer(step int64) []float32 {
	b := c.grad[step&1]
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// Gradient hands the service the input of step's optimizer step for the
// rank's shard: the reduced gradient g and the hyper-parameters h it was
// applied with (replay.Step). It needs Options.Gradient ≥ len(g). Call it
// after step's update and before Stage(step) (PROTOCOL.md, Gradient). g
// is copied into GradientBuffer(step) unless it is a prefix of it; the
// service reads it when step commits, so it must not change before the
// staging of step is waited for.
//
// The buffer's halves alternate by step parity, and a half is the
// service's until its step commits: if the staging in flight is of a step
// of the same parity (step-2: Stage(step-2), Gradient(step-1),
// Gradient(step)), Gradient first waits for it (Wait, with Wait's rules
// for ctx) and returns its error, before it writes anything.
func (c *Client) Gradient(ctx context.Context, step int64, g []float32, h replay.Hyper) error {
	if c.pending != nil && c.pendingStep&1 == step&1 {
		if err := c.Wait(ctx); err != nil {
			return err
		}
	}
	half := c.grad[step&1]
	if int64(len(g))*4 > int64(len(half)) {
		return fmt.Errorf("rank: gradient of %d elements, the buffer holds %d", len(g), len(half)/4)
	}
	if gb := Float32Bytes(g); len(gb) > 0 && unsafe.SliceData(gb) != unsafe.SliceData(half) {
		copy(half, gb)
	}
	var r GradientDone
	req := &StepReq{Step: step, N: int64(len(g)), Hyper: &Hyper{LR: h.LR, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, WeightDecay: h.WeightDecay, T: h.T}}
	c.depMu.Lock()
	if c.depStep == step {
		req.Deposits = c.depVer
	}
	c.depMu.Unlock()
	if err := c.callCtx(ctx, TypeGradient, req, TypeGradientDone, &r); err != nil {
		return err
	}
	if r.Err != "" {
		return &ServiceError{"gradient", r.Err}
	}
	return nil
}

// Status asks the service for the rank's protection status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	if err := c.callCtx(ctx, TypeStatus, &Empty{}, TypeStatusReply, &s); err != nil {
		return nil, err
	}
	if s.Err != "" {
		return nil, &ServiceError{"status", s.Err}
	}
	return &s, nil
}

// Close waits for the staging in flight, then ends the session.
func (c *Client) Close() error {
	err := c.Wait(context.Background())
	for _, u := range c.unmaps {
		err = errors.Join(err, u())
	}
	c.unmaps = nil
	return errors.Join(err, c.conn.Close())
}

// Float32Bytes views x's memory as bytes (no copy).
func Float32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*4)
}

// Deposits returns what the rank writes at step for the replica holders
// on its host that take its data-parallel peers' gradients from it
// (Optimizer.Reduced in diff mode; nil, nil otherwise): red is the full
// reduced gradient's view in step's half of the gradient buffer
// (Reduced.N elements), and ranges the parts of it to write, each
// red[Lo:Hi] = the reduced gradient's elements [Lo, Hi) of step, before
// Gradient(step), under GradientBuffer's rules. Call it once per step: the
// plan may change at each Stage, and Gradient(step) names the plan the
// rank followed.
func (c *Client) Deposits(step int64) (red []float32, ranges []DepositRange) {
	b := c.dep[step&1]
	if len(b) < 4 {
		return nil, nil
	}
	c.depMu.Lock()
	defer c.depMu.Unlock()
	c.depStep, c.depVer = step, 0
	if c.depPlan == nil || len(c.depPlan.Ranges) == 0 {
		return nil, nil
	}
	red = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	for _, r := range c.depPlan.Ranges {
		if r.Lo < 0 || r.Lo > r.Hi || r.Hi > int64(len(red)) {
			return nil, nil // not from this service: no deposits
		}
	}
	c.depVer = c.depPlan.Version
	return red, slices.Clone(c.depPlan.Ranges)
}
