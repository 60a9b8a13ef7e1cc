//go:build linux && cgo

package gpu

import (
	"fmt"
	"math/bits"
	"os"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// openFake opens the fake backend: the NVML backend's own code, run on
// go-nvml's mock of the library, set up from opt.Fake.
func openFake(opt Options) (Backend, error) {
	h, err := readFake(opt.Fake, opt.Host)
	if err != nil {
		return nil, err
	}
	return newNVMLBackend(newFake(h).lib, opt.Fake, opt)
}

// fake is the state behind a mocked NVML library.
type fake struct {
	lib    *mock.Interface
	devs   []*mock.Device // by index
	events []fakeEvent    // in time order

	mu  sync.Mutex    // guards set
	set *fakeEventSet // the newest event set, whose schedule the polled conditions follow; nil before
}

func newFake(h fakeHost) *fake {
	f := &fake{events: h.Events}
	for i, d := range h.Devices {
		f.devs = append(f.devs, f.device(i, d))
	}
	f.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(f.devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(f.devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return f.devs[i], nvml.SUCCESS
		},
		EventSetCreateFunc: f.newEventSet,
	}
	return f
}

// device mocks device i.
func (f *fake) device(i int, d fakeDevice) *mock.Device {
	return &mock.Device{
		GetIndexFunc: func() (int, nvml.Return) { return i, nvml.SUCCESS },
		GetUUIDFunc:  func() (string, nvml.Return) { return d.UUID, nvml.SUCCESS },
		GetNameFunc:  func() (string, nvml.Return) { return d.Name, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: d.MemoryMiB << 20, Free: d.MemoryMiB << 20}, nvml.SUCCESS
		},
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) { return pciInfo(d.addr), nvml.SUCCESS },
		GetCpuAffinityFunc: func(n int) ([]uint, nvml.Return) {
			if d.CPUs == nil {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			mask := make([]uint, (n+bits.UintSize-1)/bits.UintSize)
			for _, c := range d.CPUs {
				if c < n {
					mask[c/bits.UintSize] |= 1 << (c % bits.UintSize)
				}
			}
			return mask, nvml.SUCCESS
		},
		GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
			switch {
			case len(d.peers) == 0:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case l < 0 || l >= maxNVLinks:
				return 0, nvml.ERROR_INVALID_ARGUMENT
			case l < len(d.peers):
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(l int) (nvml.PciInfo, nvml.Return) {
			if l < 0 || l >= len(d.peers) {
				return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return pciInfo(d.peers[l]), nvml.SUCCESS
		},
		GetSupportedEventTypesFunc: func() (uint64, nvml.Return) { return watchedEvents, nvml.SUCCESS },
		RegisterEventsFunc: func(mask uint64, set nvml.EventSet) nvml.Return {
			s, ok := set.(*fakeEventSet)
			if !ok || mask&^watchedEvents != 0 {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			s.mu.Lock()
			s.registered[i] |= mask
			s.mu.Unlock()
			return nvml.SUCCESS
		},
		GetRetiredPagesPendingStatusFunc: func() (nvml.EnableState, nvml.Return) {
			if f.state(i, func(e *fakeEvent) *bool { return e.RetiredPagesPending }) {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		},
		GetRemappedRowsFunc: func() (int, int, bool, bool, nvml.Return) {
			pending := f.state(i, func(e *fakeEvent) *bool { return e.RowRemapPending })
			failed := f.state(i, func(e *fakeEvent) *bool { return e.RowRemapFailure })
			unc := 0
			if pending || failed {
				unc = 1
			}
			return 0, unc, pending, failed, nvml.SUCCESS
		},
	}
}

// pciInfo returns a as NVML reports it.
func pciInfo(a pciAddr) nvml.PciInfo {
	p := nvml.PciInfo{Domain: a.domain, Bus: uint32(a.bus), Device: uint32(a.dev)}
	for i, c := range fmt.Sprintf("%08X:%02X:%02X.%X", a.domain, a.bus, a.dev, a.f) {
		p.BusId[i] = int8(c)
	}
	for i, c := range fmt.Sprintf("%04X:%02X:%02X.%X", a.domain, a.bus, a.dev, a.f) {
		p.BusIdLegacy[i] = int8(c)
	}
	return p
}

// state returns the polled condition that field picks (retired pages or
// row remapping) of device dev now: the value of the device's event due
// last (of those due together, the last in time order) since the newest
// event set was made; false before.
func (f *fake) state(dev int, field func(*fakeEvent) *bool) bool {
	f.mu.Lock()
	s := f.set
	f.mu.Unlock()
	if s == nil {
		return false
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var last time.Time
	v, found := false, false
	for i := range f.events {
		e := &f.events[i]
		p := field(e)
		if e.Device != dev || p == nil {
			continue
		}
		due, ok := s.due(e, now)
		if !ok || due.After(now) || (found && due.Before(last)) {
			continue
		}
		last, v, found = due, *p, true
	}
	return v
}

// fakeEventSet is an event set of the fake: it delivers the scheduled
// xid, ecc, clock and power events when they fall due, as
// nvmlEventSetWait would, those of event types not registered for the
// device excepted.
type fakeEventSet struct {
	// Wait is defined below rather than mocked: the mock records
	// every call, and Watch calls Wait twice a second for as long as
	// it runs.
	*mock.EventSet
	f     *fake
	start time.Time

	mu         sync.Mutex           // guards the fields below
	registered []uint64             // event types, by device
	done       []bool               // by index in f.events: delivered
	seen       map[string]time.Time // when_file paths: when first seen to exist
}

var _ nvml.EventSet = (*fakeEventSet)(nil)

func (f *fake) newEventSet() (nvml.EventSet, nvml.Return) {
	s := &fakeEventSet{
		EventSet:   &mock.EventSet{FreeFunc: func() nvml.Return { return nvml.SUCCESS }},
		f:          f,
		start:      time.Now(),
		registered: make([]uint64, len(f.devs)),
		done:       make([]bool, len(f.events)),
		seen:       map[string]time.Time{},
	}
	f.mu.Lock()
	f.set = s
	f.mu.Unlock()
	return s, nvml.SUCCESS
}

// due returns when e falls due, and false while its when_file does not
// exist. It looks for the file (os.Stat) until it has seen it once: the
// event's "after" counts from then. The caller holds s.mu.
func (s *fakeEventSet) due(e *fakeEvent, now time.Time) (time.Time, bool) {
	if e.WhenFile == nil {
		return s.start.Add(time.Duration(e.After)), true
	}
	seen, ok := s.seen[*e.WhenFile]
	if !ok {
		if _, err := os.Stat(*e.WhenFile); err != nil {
			return time.Time{}, false
		}
		seen = now
		s.seen[*e.WhenFile] = seen
	}
	return seen.Add(time.Duration(e.After)), true
}

// Wait returns the next event due, waiting for it up to timeoutMs. An
// event held back by its when_file is looked for again at each call
// (Watch calls Wait every 100 ms at most) and when a scheduled event
// wakes it, never in a busy loop.
func (s *fakeEventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		now := time.Now()
		s.mu.Lock()
		i, data, due, ok := s.peek(now)
		if ok && !due.After(now) {
			s.done[i] = true
			s.mu.Unlock()
			return data, nvml.SUCCESS
		}
		s.mu.Unlock()
		wake := deadline
		if ok && due.Before(wake) {
			wake = due
		}
		if !wake.After(now) {
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
		time.Sleep(wake.Sub(now))
	}
}

// peek returns the next event to deliver (its index in s.f.events) and
// when it falls due: the earliest due of those not delivered yet, the
// first in time order of those due together, leaving out the polled
// kinds, the types not registered and the events whose when_file does
// not exist yet. The caller holds s.mu.
func (s *fakeEventSet) peek(now time.Time) (int, nvml.EventData, time.Time, bool) {
	best, bestData, bestDue := -1, nvml.EventData{}, time.Time{}
	for i := range s.f.events {
		if s.done[i] {
			continue
		}
		e := &s.f.events[i]
		data := nvml.EventData{Device: s.f.devs[e.Device]}
		switch {
		case e.XID != nil:
			data.EventType, data.EventData = nvml.EventTypeXidCriticalError, *e.XID
		case e.ECC == "single":
			data.EventType = nvml.EventTypeSingleBitEccError
		case e.ECC == "double":
			data.EventType = nvml.EventTypeDoubleBitEccError
		case e.Clock:
			data.EventType = nvml.EventTypeClock
		case e.Power:
			data.EventType = nvml.EventTypePowerSourceChange
		default:
			continue
		}
		if s.registered[e.Device]&data.EventType == 0 {
			continue
		}
		due, ok := s.due(e, now)
		if ok && (best < 0 || due.Before(bestDue)) {
			best, bestData, bestDue = i, data, due
		}
	}
	return best, bestData, bestDue, best >= 0
}
