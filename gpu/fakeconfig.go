package gpu

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// envFakeGPUs names the fake backend's JSON file when Options.Fake is "".
const envFakeGPUs = "GORUN_FAKE_GPUS"

// maxNVLinks is NVML's NVLINK_MAX_LINKS: links per device.
const maxNVLinks = 18

// maxCPUs bounds the CPU numbers of affinity masks.
const maxCPUs = 4096

// fakeFile is the fake backend's JSON (see the package documentation).
type fakeFile struct {
	fakeHost
	Hosts map[string]fakeHost `json:"hosts"`
}

// fakeHost is one host's devices and events. In a hosts section a missing
// list (nil) keeps the top level's.
type fakeHost struct {
	Devices []fakeDevice `json:"devices"`
	Events  []fakeEvent  `json:"events"`
}

type fakeDevice struct {
	UUID      string   `json:"uuid"`
	Name      string   `json:"name"`
	MemoryMiB uint64   `json:"memory_mib"`
	PCIBusID  string   `json:"pci_bus_id"`
	CPUs      []int    `json:"cpus"`
	NVLinks   []string `json:"nvlinks"` // link i goes to this PCI bus id

	addr  pciAddr   // parsed PCIBusID
	peers []pciAddr // parsed NVLinks
}

// fakeEvent is one scheduled event: exactly one of the fields after
// WhenFile says what happens.
type fakeEvent struct {
	After  duration `json:"after"`
	Device int      `json:"device"`
	// WhenFile, when given, holds the event back until that file exists:
	// After then counts from when the fake first saw it.
	WhenFile *string `json:"when_file"`

	XID                 *uint64 `json:"xid"`
	ECC                 string  `json:"ecc"`
	Clock               bool    `json:"clock"`
	Power               bool    `json:"power"`
	RetiredPagesPending *bool   `json:"retired_pages_pending"`
	RowRemapPending     *bool   `json:"row_remap_pending"`
	RowRemapFailure     *bool   `json:"row_remap_failure"`
}

// duration is a time.Duration written as in Go, "1.5s".
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("after: want a duration string such as \"1.5s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("after: %w", err)
	}
	if v < 0 {
		return fmt.Errorf("after: %q is negative", s)
	}
	*d = duration(v)
	return nil
}

// what returns the event's kind of change, and an error unless exactly one
// is given.
func (e *fakeEvent) what() (string, error) {
	var set []string
	add := func(ok bool, name string) {
		if ok {
			set = append(set, name)
		}
	}
	add(e.XID != nil, "xid")
	add(e.ECC != "", "ecc")
	add(e.Clock, "clock")
	add(e.Power, "power")
	add(e.RetiredPagesPending != nil, "retired_pages_pending")
	add(e.RowRemapPending != nil, "row_remap_pending")
	add(e.RowRemapFailure != nil, "row_remap_failure")
	switch len(set) {
	case 0:
		return "", errors.New("says nothing happens: give one of xid, ecc, clock, power, retired_pages_pending, row_remap_pending, row_remap_failure")
	case 1:
	default:
		return "", fmt.Errorf("gives %s: want one per event", strings.Join(set, " and "))
	}
	if e.ECC != "" && e.ECC != "single" && e.ECC != "double" {
		return "", fmt.Errorf("ecc %q: want \"single\" or \"double\"", e.ECC)
	}
	return set[0], nil
}

// readFake reads the fake backend's file and returns host's section (the
// top level, with the lists a hosts section gives replaced), checked, its
// events in time order.
func readFake(path, host string) (fakeHost, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return fakeHost{}, fmt.Errorf("gpu: fake GPUs: %w", err)
	}
	h, err := parseFake(data, host)
	if err != nil {
		return fakeHost{}, fmt.Errorf("gpu: fake GPUs %s: %w", path, err)
	}
	return h, nil
}

func parseFake(data []byte, host string) (fakeHost, error) {
	var f fakeFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return fakeHost{}, jsonError(data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fakeHost{}, errors.New("data after the JSON object")
	}
	// Check every section, not only this host's: a mistake should show on
	// every host.
	if _, err := f.fakeHost.checked("", ""); err != nil {
		return fakeHost{}, err
	}
	for _, name := range slices.Sorted(maps.Keys(f.Hosts)) {
		if _, err := merge(f.fakeHost, f.Hosts[name]).checked(fmt.Sprintf("hosts[%q].", name), name); err != nil {
			return fakeHost{}, err
		}
	}
	h, err := merge(f.fakeHost, f.Hosts[host]).checked("", host)
	if err != nil {
		return fakeHost{}, err
	}
	slices.SortStableFunc(h.Events, func(a, b fakeEvent) int { return cmp.Compare(a.After, b.After) })
	return h, nil
}

// merge returns top with the lists hs gives replaced.
func merge(top, hs fakeHost) fakeHost {
	if hs.Devices != nil {
		top.Devices = hs.Devices
	}
	if hs.Events != nil {
		top.Events = hs.Events
	}
	return top
}

// checked validates h and returns it with the defaults of its devices
// filled in (they depend on host: a UUID differs from host to host), their
// bus ids parsed and its events copied. where prefixes the names in errors.
func (h fakeHost) checked(where, host string) (fakeHost, error) {
	h.Devices = slices.Clone(h.Devices)
	h.Events = slices.Clone(h.Events)
	seen := map[string]int{}
	for i := range h.Devices {
		d := &h.Devices[i]
		at := fmt.Sprintf("%sdevices[%d]", where, i)
		if d.UUID == "" {
			d.UUID = fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", crc32.ChecksumIEEE([]byte(host)), i)
		}
		if !strings.HasPrefix(d.UUID, "GPU-") {
			return fakeHost{}, fmt.Errorf("%s: uuid %q does not start with GPU-", at, d.UUID)
		}
		if d.Name == "" {
			d.Name = "Fake NVIDIA GPU"
		}
		if d.PCIBusID == "" {
			d.PCIBusID = pciAddr{bus: uint8(i + 1)}.String()
		}
		var err error
		if d.addr, err = parseBusID(d.PCIBusID); err != nil {
			return fakeHost{}, fmt.Errorf("%s: %w", at, err)
		}
		for _, key := range []string{d.UUID, d.addr.String()} {
			if j, dup := seen[key]; dup {
				return fakeHost{}, fmt.Errorf("%s: %s is also devices[%d]'s", at, key, j)
			}
			seen[key] = i
		}
		for _, c := range d.CPUs {
			if c < 0 || c >= maxCPUs {
				return fakeHost{}, fmt.Errorf("%s: cpu %d: want 0 to %d", at, c, maxCPUs-1)
			}
		}
		if len(d.NVLinks) > maxNVLinks {
			return fakeHost{}, fmt.Errorf("%s: %d nvlinks: NVML allows %d", at, len(d.NVLinks), maxNVLinks)
		}
		d.peers = make([]pciAddr, len(d.NVLinks))
		for l, p := range d.NVLinks {
			if d.peers[l], err = parseBusID(p); err != nil {
				return fakeHost{}, fmt.Errorf("%s: nvlinks[%d]: %w", at, l, err)
			}
			if d.peers[l] == d.addr {
				return fakeHost{}, fmt.Errorf("%s: nvlinks[%d] links the device to itself", at, l)
			}
		}
	}
	for i := range h.Events {
		e := &h.Events[i]
		at := fmt.Sprintf("%sevents[%d]", where, i)
		if e.Device < 0 || e.Device >= len(h.Devices) {
			return fakeHost{}, fmt.Errorf("%s: device %d: there are %d devices", at, e.Device, len(h.Devices))
		}
		if _, err := e.what(); err != nil {
			return fakeHost{}, fmt.Errorf("%s: %w", at, err)
		}
		if e.WhenFile != nil && !filepath.IsAbs(*e.WhenFile) {
			return fakeHost{}, fmt.Errorf("%s: when_file %q: want an absolute path", at, *e.WhenFile)
		}
	}
	return h, nil
}

// jsonError says where in data a decoding error is.
func jsonError(data []byte, err error) error {
	var off int64 = -1
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		off = syn.Offset
	case errors.As(err, &typ):
		off = typ.Offset
	}
	if off < 0 || off > int64(len(data)) {
		return err
	}
	line := 1 + bytes.Count(data[:off], []byte("\n"))
	return fmt.Errorf("line %d: %w", line, err)
}
