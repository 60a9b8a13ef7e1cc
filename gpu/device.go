package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Device is one GPU.
type Device struct {
	Index       int    // NVML index (PCI bus order)
	UUID        string // "GPU-..."
	Name        string
	MemoryBytes uint64
	PCIBusID    string   // as in sysfs: "0000:07:00.0" (lower case, domain of at least 4 digits)
	CPUs        []int    // CPUs near the device (NVML CPU affinity), ascending; nil if unknown
	NVLinks     []NVLink // active links, by link number
}

// NVLink is one active NVLink of a device.
type NVLink struct {
	Link         int    // link number on the device
	PeerPCIBusID string // the remote end (a GPU, or an NVSwitch), as Device.PCIBusID; "" if NVML cannot tell
	PeerIndex    int    // the remote GPU's Index; -1 if the peer is not a GPU of this host
}

// cloneDevices copies devs, slices included, so that callers cannot change
// a backend's own list.
func cloneDevices(devs []Device) []Device {
	out := slices.Clone(devs)
	for i := range out {
		out[i].CPUs = slices.Clone(out[i].CPUs)
		out[i].NVLinks = slices.Clone(out[i].NVLinks)
	}
	return out
}

// pciAddr is a PCI address: domain, bus, device, function.
type pciAddr struct {
	domain      uint32
	bus, dev, f uint8
}

// parseBusID parses a PCI bus id in NVML's form ("00000000:07:00.0") or
// sysfs's ("0000:07:00.0"), in either case; the domain may be left out.
func parseBusID(s string) (pciAddr, error) {
	bad := fmt.Errorf("bad PCI bus id %q: want domain:bus:device.function, like 0000:07:00.0", s)
	var a pciAddr
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return a, bad
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return a, bad
	}
	dom, err1 := strconv.ParseUint(parts[0], 16, 32)
	bus, err2 := strconv.ParseUint(parts[1], 16, 8)
	dev, err3 := strconv.ParseUint(devFn[0], 16, 5)
	fn, err4 := strconv.ParseUint(devFn[1], 16, 3)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || len(parts[0]) > 8 || len(parts[1]) > 2 || len(devFn[0]) > 2 || len(devFn[1]) > 1 {
		return a, bad
	}
	return pciAddr{uint32(dom), uint8(bus), uint8(dev), uint8(fn)}, nil
}

// String returns the sysfs form, "0000:07:00.0".
func (a pciAddr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.dev, a.f)
}

// normalizeBusID returns s in sysfs form, or s itself if it does not parse.
func normalizeBusID(s string) string {
	a, err := parseBusID(s)
	if err != nil {
		return s
	}
	return a.String()
}
