package gpu

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseFakeErrors(t *testing.T) {
	const dev = `{"uuid":"GPU-a","pci_bus_id":"0000:07:00.0"}`
	tests := []struct {
		name, json, err string
	}{
		{"syntax", "{\n\"devices\": [\n{\"uuid\": \"GPU-a\",}\n]}", "line 3: invalid character '}'"},
		{"not an object", `[1]`, "cannot unmarshal array"},
		{"empty", ``, "EOF"},
		{"trailing data", `{} {}`, "data after the JSON object"},
		{"unknown field at top", `{"devics":[]}`, `unknown field "devics"`},
		{"unknown device field", `{"devices":[{"uuid":"GPU-a","memory":1}]}`, `unknown field "memory"`},
		{"unknown event field", `{"devices":[` + dev + `],"events":[{"after":"1s","device":0,"xid":79,"severity":1}]}`, `unknown field "severity"`},
		{"unknown host field", `{"hosts":{"h1":{"gpus":[]}}}`, `unknown field "gpus"`},
		{"wrong type", `{"devices":[{"memory_mib":"lots"}]}`, "line 1: json: cannot unmarshal string"},
		{"uuid", `{"devices":[{"uuid":"8932f937"}]}`, `devices[0]: uuid "8932f937" does not start with GPU-`},
		{"same uuid", `{"devices":[` + dev + `,{"uuid":"GPU-a"}]}`, "devices[1]: GPU-a is also devices[0]'s"},
		{"same bus id", `{"devices":[` + dev + `,{"uuid":"GPU-b","pci_bus_id":"00000000:07:00.0"}]}`, "devices[1]: 0000:07:00.0 is also devices[0]'s"},
		{"bus id", `{"devices":[{"pci_bus_id":"07:00"}]}`, `devices[0]: bad PCI bus id "07:00"`},
		{"bus id function", `{"devices":[{"pci_bus_id":"0000:07:00.8"}]}`, `bad PCI bus id "0000:07:00.8"`},
		{"cpu", `{"devices":[{"cpus":[0,-1]}]}`, "devices[0]: cpu -1"},
		{"too many links", `{"devices":[{"nvlinks":["1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0","1:0.0"]}]}`, "19 nvlinks: NVML allows 18"},
		{"link to itself", `{"devices":[{"pci_bus_id":"0000:07:00.0","nvlinks":["0000:07:00.0"]}]}`, "nvlinks[0] links the device to itself"},
		{"bad link", `{"devices":[{"nvlinks":["x"]}]}`, `nvlinks[0]: bad PCI bus id "x"`},
		{"missing device", `{"devices":[` + dev + `],"events":[{"after":"1s","device":1,"xid":79}]}`, "events[0]: device 1: there are 1 devices"},
		{"negative device", `{"devices":[` + dev + `],"events":[{"device":-1,"xid":79}]}`, "events[0]: device -1"},
		{"event without devices", `{"events":[{"after":"1s","xid":79}]}`, "events[0]: device 0: there are 0 devices"},
		{"nothing happens", `{"devices":[` + dev + `],"events":[{"after":"1s","device":0}]}`, "events[0]: says nothing happens"},
		{"two things happen", `{"devices":[` + dev + `],"events":[{"after":"1s","device":0,"xid":79,"ecc":"double"}]}`, "events[0]: gives xid and ecc: want one per event"},
		{"ecc", `{"devices":[` + dev + `],"events":[{"device":0,"ecc":"triple"}]}`, `ecc "triple": want "single" or "double"`},
		{"after", `{"devices":[` + dev + `],"events":[{"after":"soon","device":0,"xid":79}]}`, `after: time: invalid duration "soon"`},
		{"after number", `{"devices":[` + dev + `],"events":[{"after":1.5,"device":0,"xid":79}]}`, `after: want a duration string such as "1.5s", got 1.5`},
		{"negative after", `{"devices":[` + dev + `],"events":[{"after":"-1s","device":0,"xid":79}]}`, `after: "-1s" is negative`},
		{"xid", `{"devices":[` + dev + `],"events":[{"device":0,"xid":-79}]}`, "cannot unmarshal number -79"},
		{"relative when_file", `{"devices":[` + dev + `],"events":[{"device":0,"xid":79,"when_file":"run/fail"}]}`, `events[0]: when_file "run/fail": want an absolute path`},
		{"empty when_file", `{"devices":[` + dev + `],"events":[{"device":0,"xid":79,"when_file":""}]}`, `events[0]: when_file "": want an absolute path`},
		{"when_file not a string", `{"devices":[` + dev + `],"events":[{"device":0,"xid":79,"when_file":true}]}`, "cannot unmarshal bool"},
		{"other host's when_file", `{"devices":[` + dev + `],"hosts":{"h2":{"events":[{"device":0,"xid":79,"when_file":"x"}]}}}`, `hosts["h2"].events[0]: when_file "x": want an absolute path`},
		// A bad section is an error on every host, and names the section.
		{"other host's event", `{"devices":[` + dev + `],"hosts":{"h2":{"events":[{"after":"1s","device":3,"xid":79}]}}}`, `hosts["h2"].events[0]: device 3: there are 1 devices`},
		{"other host's devices", `{"devices":[` + dev + `],"events":[{"device":0,"xid":79}],"hosts":{"h2":{"devices":[]}}}`, `hosts["h2"].events[0]: device 0: there are 0 devices`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseFake([]byte(tc.json), "h1")
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("parseFake = %+v, %v; want an error saying %q", h, err, tc.err)
			}
		})
	}
}

func TestReadFakeNamesFile(t *testing.T) {
	_, err := readFake("testdata/unknown-field.json", "")
	if err == nil || !strings.Contains(err.Error(), `gpu: fake GPUs testdata/unknown-field.json: json: unknown field "severity"`) {
		t.Errorf("readFake = %v; want an error naming the file and the field", err)
	}
	missing := filepath.Join(t.TempDir(), "none.json")
	if _, err := readFake(missing, ""); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("readFake(missing) = %v; want a not-exist error naming the file", err)
	}
}

func TestParseFakeHosts(t *testing.T) {
	data, err := os.ReadFile("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host    string
		devices int
		events  []string // what(), in time order
	}{
		{"", 2, []string{"xid", "ecc", "retired_pages_pending"}},
		{"node1", 2, []string{"xid", "ecc", "retired_pages_pending"}},
		{"node2", 2, []string{"row_remap_failure"}},
		{"node3", 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			h, err := parseFake(data, tc.host)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range h.Events {
				w, _ := e.what()
				got = append(got, w)
			}
			if len(h.Devices) != tc.devices || strings.Join(got, " ") != strings.Join(tc.events, " ") {
				t.Fatalf("%d devices, events %v; want %d, %v", len(h.Devices), got, tc.devices, tc.events)
			}
		})
	}
}

func TestParseFakeDefaultsAndOrder(t *testing.T) {
	const js = `{"devices":[{},{"pci_bus_id":"0000:AB:00.0"}],
		"events":[{"after":"2s","device":1,"xid":13},{"after":"1s","device":0,"xid":79},{"after":"1s","device":1,"clock":true},{"device":0,"power":true}]}`
	a, err := parseFake([]byte(js), "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseFake([]byte(js), "b")
	if err != nil {
		t.Fatal(err)
	}
	d := a.Devices[0]
	if !strings.HasPrefix(d.UUID, "GPU-") || d.UUID == a.Devices[1].UUID || d.UUID == b.Devices[0].UUID || d.Name == "" || d.addr.String() != "0000:01:00.0" {
		t.Errorf("defaults: %+v, %+v, other host %+v", d, a.Devices[1], b.Devices[0])
	}
	if a.Devices[1].addr.String() != "0000:ab:00.0" {
		t.Errorf("bus id %v, want 0000:ab:00.0", a.Devices[1].addr)
	}
	var after []time.Duration
	var first []bool
	for _, e := range a.Events {
		after = append(after, time.Duration(e.After))
		first = append(first, e.XID != nil && *e.XID == 79)
	}
	// In time order; events due together keep the file's order.
	if want := []time.Duration{0, time.Second, time.Second, 2 * time.Second}; !equal(after, want) || !first[1] {
		t.Errorf("events at %v (xid 79 second: %v); want %v, xid 79 before the clock event", after, first[1], want)
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzParseFake: parseFake never panics, and what it accepts is checked:
// events in time order naming devices the host has, when_file paths
// absolute, device addresses distinct.
func FuzzParseFake(f *testing.F) {
	for _, name := range []string{"example.json", "hgx8.json", "pcie4.json", "unknown-field.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "node2")
	}
	f.Add([]byte(`{"devices":[{}],"events":[{"after":"1s","device":0,"xid":79,"when_file":"/run/fail"}]}`), "h1")
	f.Add([]byte(`{"devices":[{}],"events":[{"device":0,"row_remap_pending":true,"when_file":"x"}]}`), "")
	f.Fuzz(func(t *testing.T, data []byte, host string) {
		h, err := parseFake(data, host)
		if err != nil {
			return
		}
		seen := map[pciAddr]bool{}
		for _, d := range h.Devices {
			if seen[d.addr] || !strings.HasPrefix(d.UUID, "GPU-") {
				t.Fatalf("device %+v: address repeated or bad uuid", d)
			}
			seen[d.addr] = true
		}
		for i, e := range h.Events {
			if e.Device < 0 || e.Device >= len(h.Devices) {
				t.Fatalf("event %d names device %d of %d", i, e.Device, len(h.Devices))
			}
			if i > 0 && e.After < h.Events[i-1].After {
				t.Fatalf("event %d out of time order", i)
			}
			if e.WhenFile != nil && !filepath.IsAbs(*e.WhenFile) {
				t.Fatalf("event %d: when_file %q accepted", i, *e.WhenFile)
			}
			if _, err := e.what(); err != nil {
				t.Fatalf("event %d accepted: %v", i, err)
			}
		}
	})
}
