package keeper

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/protect"
)

// hello creates the rank's slots, or checks that a restarted rank declares
// the regions its predecessor did.
func (s *service) hello(req *protect.ProtectHello) (*protect.ProtectWelcome, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.helloLocked(req)
	if err != nil {
		return nil, 0, err
	}
	// The newest session of a rank is the one that may change its state:
	// an older one belongs to a rank process that is gone or gave up.
	s.session++
	s.dep.open = true
	return w, s.session, nil
}

func (s *service) helloLocked(req *protect.ProtectHello) (*protect.ProtectWelcome, error) {
	// A hello that passed its session's checks before the rank left (or
	// the host stopped) must not create files that nothing would remove.
	if s.gone {
		return nil, errLeft
	}
	if s.life.Err() != nil {
		return nil, ErrStopping
	}
	diff := s.h.diffMode()
	if diff {
		if req.Optimizer == nil {
			return nil, errors.New(errNoOptimizer)
		}
		if err := req.Optimizer.Check(req.Regions, req.Gradient); err != nil {
			return nil, fmt.Errorf("--protect-mode diff: %w", err)
		}
	}
	if s.preloaded {
		return s.helloPreloaded(req)
	}
	if s.slots != nil {
		if !slices.Equal(s.regions, req.Regions) {
			return nil, fmt.Errorf("regions %v differ from the %v this rank protected before", req.Regions, s.regions)
		}
		if req.Gradient*4 != s.gradSize() {
			return nil, fmt.Errorf("a gradient of %d elements differs from the %d this rank declared before", req.Gradient, s.gradSize()/4)
		}
		if diff && s.opt != nil && !req.Optimizer.Equal(s.opt) {
			return nil, fmt.Errorf("optimizer %+v differs from the %+v this rank declared before", *req.Optimizer, *s.opt)
		}
		if diff && s.opt == nil {
			s.opt = req.Optimizer.Clone()
		}
		return s.welcome(), nil
	}
	cr := make([]ckpt.Region, len(req.Regions))
	for i, r := range req.Regions {
		cr[i] = ckpt.Region{Name: r.Name, Size: r.Size}
	}
	s.h.claimFiles()
	opt := ckpt.Options{Dir: s.h.cfg.Dir}
	var slots *ckpt.Slots
	err := s.h.names(s.rank, func() error {
		var err error
		slots, err = ckpt.Create(s.h.cfg.Job, s.rank, cr, opt)
		if err != nil || req.Gradient <= 0 {
			return err
		}
		var reduced int64
		if diff && req.Optimizer.Reduced != nil {
			reduced = req.Optimizer.Reduced.N
		}
		if err := s.createGradient(req.Gradient*4, reduced); err != nil {
			slots.Close()
			if _, rerr := ckpt.RemoveOwned(slots.Owned()); rerr != nil {
				s.h.log.Warn("cannot remove the slots of a ProtectHello that failed", "rank", s.rank, "err", rerr)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.owned = append(s.owned, slots.Owned()...)
	s.slots = slots
	if diff {
		s.opt = req.Optimizer.Clone()
	}
	s.regions = slices.Clone(req.Regions)
	s.files = slots.Files()
	s.repl = s.repl[:0]
	for i, r := range s.regions {
		if r.Name != "params" {
			s.repl = append(s.repl, i)
		}
	}
	for i := range 2 {
		s.views[i] = make([][]byte, len(s.files))
	}
	return s.welcome(), nil
}

func (s *service) gradSize() int64 {
	if s.gradFile == nil {
		return 0
	}
	return s.gradFile.Size
}

// createGradient creates the gradient buffer, a file beside the rank's
// slot files and named as theirs are (so that ckpt.RemoveJob removes it
// too): two halves of size bytes, at offsets 0 and stride (GradientFile).
// With reduced > 0 each half also has a deposit area of reduced float32s
// after the page that ends the gradient (GradientFile.Deposit), left
// sparse: a deposit plan allocates its ranges (localpeer.go). The
// caller holds the rank's names lock (Keeper.names); it does not take it
// itself: the lock does not nest (ckpt.Claim.Names).
func (s *service) createGradient(size, reduced int64) error {
	end, dep := size, int64(0)
	if reduced > 0 {
		dep = (size + 4095) &^ 4095
		end = dep + 4*reduced
	}
	stride := (end + 4095) &^ 4095
	f := ckpt.RegionFile{Name: protect.GradientRegion, Size: end, Stride: stride, Path: s.gradientPath()}
	_ = os.Remove(f.Path)
	fd, err := os.OpenFile(f.Path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("gradient buffer: %w", err)
	}
	owned, err := ckpt.OwnFile(fd)
	if err != nil {
		fd.Close()
		os.Remove(f.Path) // made a moment ago, but not held
		return fmt.Errorf("gradient buffer: %w", err)
	}
	drop := func() { _, _ = ckpt.RemoveOwned([]ckpt.OwnedFile{owned}) }
	if reduced > 0 {
		err = fd.Truncate(2 * stride)
		for half := range int64(2) {
			if err == nil && size > 0 {
				err = syscall.Fallocate(int(fd.Fd()), 0, half*stride, size)
			}
		}
	} else {
		err = syscall.Fallocate(int(fd.Fd()), 0, 0, 2*stride)
	}
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil && 2*stride > 0 {
		drop()
		return fmt.Errorf("gradient buffer of %d bytes: %w", size, err)
	}
	views, unmap, err := ckpt.MapData(f)
	if err != nil {
		drop()
		return fmt.Errorf("gradient buffer: %w", err)
	}
	s.grad = views
	s.gradUnmap = unmap
	s.owned = append(s.owned, owned)
	s.gradFile = &protect.GradientFile{Path: f.Path, Size: size, Stride: stride}
	if reduced > 0 {
		s.gradFile.Deposit, s.gradFile.Reduced = dep, reduced
	}
	return nil
}

func (s *service) gradientPath() string {
	return ckpt.RegionPath(s.h.cfg.Job, s.rank, protect.GradientRegion, ckpt.Options{Dir: s.h.cfg.Dir})
}

func (s *service) welcome() *protect.ProtectWelcome {
	w := &protect.ProtectWelcome{
		Version: protect.Version, Job: s.h.cfg.Job, Rank: s.rank, Replicas: len(s.h.holders(s.rank)),
		Gradient: s.gradFile, Committed: s.committed, G: s.h.G(), Mode: s.h.mode(),
		Deposits: s.depositPlan(),
	}
	for _, f := range s.files {
		w.Regions = append(w.Regions, protect.RegionFile{Name: f.Name, Size: f.Size, Path: f.Path, Stride: f.Stride})
	}
	return w
}
