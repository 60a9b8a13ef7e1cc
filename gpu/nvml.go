//go:build linux && cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// waitTimeout bounds each nvmlEventSetWait, and so how long a Watch takes
// to notice that its context has ended.
const waitTimeout = 100 * time.Millisecond

// watchedEvents are the NVML event types Watch registers, on each device
// the subset it supports.
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError |
	nvml.EventTypeDoubleBitEccError | nvml.EventTypeClock | nvml.EventTypePowerSourceChange

// nvmlBackend is the Backend of a host with NVML: the real library, or the
// fake backend's mock of it.
type nvmlBackend struct {
	lib      nvml.Interface
	handles  []nvml.Device       // by Index; immutable after open
	devs     []Device            // by Index; immutable after open
	byHandle map[nvml.Device]int // handle -> Index; immutable after open
	poll     time.Duration
	log      *slog.Logger

	mu     sync.Mutex // guards the fields below
	closed bool
	stop   context.CancelFunc // ends the running Watch's goroutine; nil if none runs
	wg     sync.WaitGroup     // waits for it
}

var _ Backend = (*nvmlBackend)(nil)

func openNVML(opt Options) (Backend, error) {
	lib, name := nvml.New(), "libnvidia-ml.so.1"
	if opt.LibraryPath != "" {
		lib, name = nvml.New(nvml.WithLibraryPath(opt.LibraryPath)), opt.LibraryPath
	}
	return newNVMLBackend(lib, name, opt)
}

// newNVMLBackend initializes lib (named name in errors) and finds its
// devices.
func newNVMLBackend(lib nvml.Interface, name string, opt Options) (*nvmlBackend, error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("%w: NVML library %s not found", ErrNoDriver, name)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("%w: nvmlInit: the NVIDIA kernel driver is not loaded (%v)", ErrNoDriver, ret)
	default:
		return nil, nvmlError("nvmlInit", -1, ret)
	}
	b := &nvmlBackend{lib: lib, poll: opt.PollInterval, log: opt.Logger}
	if err := b.discover(); err != nil {
		lib.Shutdown()
		return nil, err
	}
	return b, nil
}

// nvmlError is the error of an NVML call that failed, on device dev (-1:
// none). It wraps ret (an nvml.Return).
func nvmlError(call string, dev int, ret nvml.Return) error {
	if dev < 0 {
		return fmt.Errorf("gpu: %s: %w", call, ret)
	}
	return fmt.Errorf("gpu: %s (GPU %d): %w", call, dev, ret)
}

func (b *nvmlBackend) discover() error {
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nvmlError("nvmlDeviceGetCount", -1, ret)
	}
	b.handles = make([]nvml.Device, n)
	b.devs = make([]Device, n)
	b.byHandle = make(map[nvml.Device]int, n)
	byBus := make(map[string]int, n)
	for i := range n {
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nvmlError("nvmlDeviceGetHandleByIndex", i, ret)
		}
		d, err := describe(h, i)
		if err != nil {
			return err
		}
		b.handles[i], b.devs[i], b.byHandle[h] = h, d, i
		byBus[d.PCIBusID] = i
	}
	for i := range b.devs {
		for l := range b.devs[i].NVLinks {
			if peer, ok := byBus[b.devs[i].NVLinks[l].PeerPCIBusID]; ok {
				b.devs[i].NVLinks[l].PeerIndex = peer
			}
		}
	}
	return nil
}

// describe asks NVML about device i.
func describe(h nvml.Device, i int) (Device, error) {
	d := Device{Index: i}
	var ret nvml.Return
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return d, nvmlError("nvmlDeviceGetUUID", i, ret)
	}
	if d.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return d, nvmlError("nvmlDeviceGetName", i, ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return d, nvmlError("nvmlDeviceGetMemoryInfo", i, ret)
	}
	d.MemoryBytes = mem.Total
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlError("nvmlDeviceGetPciInfo", i, ret)
	}
	d.PCIBusID = normalizeBusID(busID(pci))
	mask, ret := h.GetCpuAffinity(maxCPUs)
	switch ret {
	case nvml.SUCCESS:
		d.CPUs = cpuList(mask)
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return d, nvmlError("nvmlDeviceGetCpuAffinity", i, ret)
	}
	for l := range nvml.NVLINK_MAX_LINKS {
		state, ret := h.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no NVLink, or no link l
		}
		if ret != nvml.SUCCESS {
			return d, nvmlError(fmt.Sprintf("nvmlDeviceGetNvLinkState(link %d)", l), i, ret)
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		link := NVLink{Link: l, PeerIndex: -1}
		remote, ret := h.GetNvLinkRemotePciInfo(l)
		switch ret {
		case nvml.SUCCESS:
			link.PeerPCIBusID = normalizeBusID(busID(remote))
		case nvml.ERROR_NOT_SUPPORTED:
		default:
			return d, nvmlError(fmt.Sprintf("nvmlDeviceGetNvLinkRemotePciInfo(link %d)", l), i, ret)
		}
		d.NVLinks = append(d.NVLinks, link)
	}
	return d, nil
}

// busID returns the PCI bus id of pci, as NVML writes it ("00000000:07:00.0").
func busID(pci nvml.PciInfo) string {
	b := make([]byte, 0, len(pci.BusId))
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// cpuList returns the CPUs of an affinity mask (bit c of the mask is CPU
// c), ascending; nil if there are none.
func cpuList(mask []uint) []int {
	var cpus []int
	for w, word := range mask {
		for word != 0 {
			cpus = append(cpus, w*bits.UintSize+bits.TrailingZeros(word))
			word &= word - 1
		}
	}
	return cpus
}

func (b *nvmlBackend) Devices() []Device { return cloneDevices(b.devs) }

func (b *nvmlBackend) Watch(ctx context.Context) (<-chan Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errors.New("gpu: Watch after Close")
	}
	if b.stop != nil {
		return nil, errors.New("gpu: Watch is already running")
	}
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlEventSetCreate", -1, ret)
	}
	for i, h := range b.handles {
		supported, ret := h.GetSupportedEventTypes()
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED:
			supported = 0
		default:
			set.Free()
			return nil, nvmlError("nvmlDeviceGetSupportedEventTypes", i, ret)
		}
		mask := supported & watchedEvents
		if mask != watchedEvents {
			b.log.Debug("GPU does not report every health event", "gpu", i, "supported", fmt.Sprintf("%#x", supported), "wanted", fmt.Sprintf("%#x", watchedEvents))
		}
		if mask == 0 {
			continue
		}
		if ret := h.RegisterEvents(mask, set); ret != nvml.SUCCESS {
			set.Free()
			return nil, nvmlError("nvmlDeviceRegisterEvents", i, ret)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan Event, 16)
	b.stop = cancel
	b.wg.Add(1)
	go b.run(ctx, set, ch)
	return ch, nil
}

// run is a Watch's goroutine: it waits for events on set and polls the
// devices' memory health every b.poll until ctx ends, then frees set and
// closes ch.
func (b *nvmlBackend) run(ctx context.Context, set nvml.EventSet, ch chan<- Event) {
	defer b.wg.Done()
	defer close(ch)
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			b.log.Warn("GPU health: nvmlEventSetFree failed", "err", ret)
		}
		b.mu.Lock()
		b.stop()
		b.stop = nil
		b.mu.Unlock()
	}()
	health := make([]memHealth, len(b.handles))
	nextPoll := time.Now()
	waitErr := nvml.SUCCESS // the last failure of Wait, logged once
	for ctx.Err() == nil {
		if now := time.Now(); !now.Before(nextPoll) {
			for _, e := range b.pollMemory(health) {
				if !send(ctx, ch, e) {
					return
				}
			}
			nextPoll = now.Add(b.poll)
		}
		timeout := max(min(waitTimeout, time.Until(nextPoll)), time.Millisecond)
		data, ret := set.Wait(uint32(timeout.Milliseconds()))
		switch ret {
		case nvml.SUCCESS:
			if e, ok := b.convert(data); ok && !send(ctx, ch, e) {
				return
			}
		case nvml.ERROR_TIMEOUT:
		default:
			if ret != waitErr {
				b.log.Warn("GPU health: nvmlEventSetWait failed", "err", ret)
			}
			waitErr = ret
			// Do not spin on a failing event set; polling goes on.
			select {
			case <-ctx.Done():
			case <-time.After(timeout):
			}
			continue
		}
		waitErr = nvml.SUCCESS
	}
}

// send sends e on ch unless ctx has ended.
func send(ctx context.Context, ch chan<- Event, e Event) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case ch <- e:
		return true
	case <-ctx.Done():
		return false
	}
}

// convert turns an NVML event into an Event; false for types Watch does
// not report.
func (b *nvmlBackend) convert(data nvml.EventData) (Event, bool) {
	var e Event
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		e.Kind, e.XID = KindXID, data.EventData
		e.Class, e.Detail = ClassifyXID(data.EventData)
	case nvml.EventTypeSingleBitEccError:
		e.Kind, e.Class, e.Detail = KindECCSingleBit, Transient, "single-bit ECC error (corrected)"
	case nvml.EventTypeDoubleBitEccError:
		e.Kind, e.Class, e.Detail = KindECCDoubleBit, Permanent, "double-bit ECC error (uncorrectable)"
	case nvml.EventTypeClock:
		e.Kind, e.Class, e.Detail = KindClock, Transient, "clocks changed"
	case nvml.EventTypePowerSourceChange:
		e.Kind, e.Class, e.Detail = KindPower, Transient, "power source changed"
	default:
		b.log.Debug("GPU health: ignoring NVML event", "type", fmt.Sprintf("%#x", data.EventType))
		return e, false
	}
	e.Time, e.Device = time.Now(), b.index(data.Device)
	if e.Device >= 0 {
		e.UUID = b.devs[e.Device].UUID
	} else {
		b.log.Warn("GPU health: event from a device NVML did not list at start", "detail", e.Detail)
	}
	return e, true
}

// index returns the Index of the device with handle h, -1 if unknown.
func (b *nvmlBackend) index(h nvml.Device) int {
	if i, ok := b.byHandle[h]; ok {
		return i
	}
	if h == nil {
		return -1
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return -1
	}
	for i, d := range b.devs {
		if d.UUID == uuid {
			return i
		}
	}
	return -1
}

// memHealth is what the polling of one device knows.
type memHealth struct {
	retiredPending, remapPending, remapFailed bool // as last seen
	noRetired, noRemap                        bool // NVML does not support the query on this device
	retiredErr, remapErr                      nvml.Return
}

// pollMemory asks every device whether retired pages or remapped rows
// await a reset, and whether remapping failed, and returns an event for
// each condition that has newly arisen.
func (b *nvmlBackend) pollMemory(health []memHealth) []Event {
	var events []Event
	for i, h := range b.handles {
		s := &health[i]
		if !s.noRetired {
			state, ret := h.GetRetiredPagesPendingStatus()
			s.noRetired = ret == nvml.ERROR_NOT_SUPPORTED
			if b.pollOK(i, "nvmlDeviceGetRetiredPagesPendingStatus", ret, &s.retiredErr) &&
				rose(&s.retiredPending, state == nvml.FEATURE_ENABLED) {
				events = append(events, b.event(i, KindRetiredPagesPending, "retired pages pending: reset the GPU to stop using them"))
			}
		}
		if !s.noRemap {
			_, _, pending, failed, ret := h.GetRemappedRows()
			s.noRemap = ret == nvml.ERROR_NOT_SUPPORTED
			if b.pollOK(i, "nvmlDeviceGetRemappedRows", ret, &s.remapErr) {
				if rose(&s.remapPending, pending) {
					events = append(events, b.event(i, KindRowRemapPending, "row remapping pending: reset the GPU to activate it"))
				}
				if rose(&s.remapFailed, failed) {
					events = append(events, b.event(i, KindRowRemapFailure, "row remapping failed: no spare row left"))
				}
			}
		}
	}
	return events
}

// pollOK says whether a polling call on device i succeeded, and logs a
// failure when it differs from the call's previous one (*last).
func (b *nvmlBackend) pollOK(i int, call string, ret nvml.Return, last *nvml.Return) bool {
	if ret != *last && ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		b.log.Warn("GPU health: polling failed", "gpu", i, "call", call, "err", ret)
	}
	*last = ret
	return ret == nvml.SUCCESS
}

// rose sets *was to now and says whether it went from false to true.
func rose(was *bool, now bool) bool {
	r := now && !*was
	*was = now
	return r
}

// event returns a Permanent event of device i (the polled kinds).
func (b *nvmlBackend) event(i int, k Kind, detail string) Event {
	return Event{Time: time.Now(), Device: i, UUID: b.devs[i].UUID, Kind: k, Class: Permanent, Detail: detail}
}

func (b *nvmlBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.stop != nil {
		b.stop()
	}
	b.mu.Unlock()
	b.wg.Wait()
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return nvmlError("nvmlShutdown", -1, ret)
	}
	return nil
}
