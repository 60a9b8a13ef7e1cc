// Package gpu finds a host's NVIDIA GPUs through NVML (go-nvml), gives each
// local rank its GPUs and the CPUs near them, and reports the GPUs' health
// events, classified by what they call for. It is the only package of gorun
// that uses cgo, and it imports nothing of gorun.
//
// # Backends
//
// [Open] returns the host's [Backend]: NVML, or the fake backend described
// below when Options.Fake or $GORUN_FAKE_GPUS names a file. Both run the
// same code; the fake replaces only the library, with go-nvml's mocks.
// Without a driver (libnvidia-ml.so.1 not found, or the kernel driver not
// loaded) and in a build without cgo, Open's error wraps [ErrNoDriver] and
// the caller runs CPU-only; every other failure is a real error naming the
// NVML call. [Backend.Devices] lists the devices found at Open, in NVML
// order (PCI bus order), with their memory, PCI bus id, nearby CPUs (NVML's
// CPU affinity) and active NVLinks.
//
// # Binding ranks
//
// [Restrict] first keeps the devices an allocation gave the agent (its own
// CUDA_VISIBLE_DEVICES, as Slurm's gres sets it). [Bind] then gives local
// rank r of n one device, round-robin (r mod the device count), or G
// devices, [r·G, r·G+G), and the union of their CPUs. The rank's
// CUDA_VISIBLE_DEVICES is Binding.VisibleDevices: NVML indices. NVML counts
// in PCI bus order but CUDA by default counts fastest first, so the rank
// also needs CUDA_DEVICE_ORDER=PCI_BUS_ID for the two to agree.
//
// # Health
//
// [Backend.Watch] registers, on each device, the subset it supports of
// NVML's XID critical-error, single- and double-bit ECC, clock and
// power-source events, and waits for them (nvmlEventSetWait, 100 ms at a
// time, which bounds how long Watch takes to notice its context has
// ended). At its start and every Options.PollInterval (30 s by default) it
// also polls each device's retired-pages-pending status and remapped rows
// (nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows), and
// reports a pending retirement, a pending row remap and a remap failure
// once each time one arises (already at the first poll, if present when
// Watch starts); a query the device does not support is not asked again.
// Events are sent in the order they happen, on a channel with a small
// buffer; a slow reader holds the watch up but loses nothing.
//
// Every [Event] has a [Class], after DEADPOOL's Table II (DESIGN.md §6):
// Transient (the device is sound; at most the process on it failed: restart
// in place), Permanent (GPU memory, PCIe, NVLink or firmware faults: replace
// the host) or Unknown (stop and report). XIDs are classified by
// [ClassifyXID]'s table, which follows NVIDIA's Xid catalog:
//
//	transient  8, 11, 13, 31, 43, 45
//	permanent  46, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120
//	unknown    every other XID
//
// Double-bit ECC errors and the three polled conditions are Permanent;
// single-bit ECC errors, clock and power-source changes are Transient.
//
// # The fake backend
//
// The fake backend reads a JSON file (Options.Fake, else $GORUN_FAKE_GPUS)
// and mocks NVML with it, so that tests and demos run the NVML backend's
// discovery, event and polling code on machines without GPUs:
//
//	{
//	  "devices": [
//	    {"uuid": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "name": "NVIDIA H100 80GB HBM3",
//	     "memory_mib": 81920, "pci_bus_id": "0000:07:00.0", "cpus": [0, 1, 2, 3],
//	     "nvlinks": ["0000:08:00.0", "0000:08:00.0"]},
//	    {"pci_bus_id": "0000:08:00.0", "nvlinks": ["0000:07:00.0", "0000:07:00.0"]}
//	  ],
//	  "events": [
//	    {"after": "1.5s", "device": 0, "xid": 79},
//	    {"after": "2s", "device": 1, "ecc": "double"},
//	    {"after": "3s", "device": 0, "retired_pages_pending": true}
//	  ],
//	  "hosts": {
//	    "node2": {"events": [{"after": "500ms", "device": 1, "row_remap_failure": true}]},
//	    "node3": {"devices": [], "events": []}
//	  }
//	}
//
// A device has a uuid (starting "GPU-"; default: derived from the host name
// and the index), a name (default "Fake NVIDIA GPU"), memory_mib (default
// 0), a pci_bus_id (default 0000:01:00.0 for the first device, 0000:02:00.0
// for the second, ...), cpus (its CPU affinity; absent: unknown) and
// nvlinks (link i is active and goes to that PCI bus id, up to 18 links).
// UUIDs and bus ids must differ between a host's devices. The devices get
// NVML indices in the order listed.
//
// An event happens "after" a Go duration counted from the start of each
// [Backend.Watch] (every Watch replays the schedule), on the device with
// that index, and is exactly one of: "xid": N (an XID critical error),
// "ecc": "single" or "double", "clock": true, "power": true (delivered as
// NVML events), or "retired_pages_pending", "row_remap_pending",
// "row_remap_failure": true or false (the state the polling reads from
// then on; false clears it, as a GPU reset would).
//
// An event may also wait for a file: with "when_file": "/abs/path" it is
// held back until that file exists, and its "after" then counts from when
// the fake first saw the file (each Watch looks for it afresh). Watch looks
// for it each time it waits for events, so at most 100 ms after it
// appears, and at each poll for the polled conditions; creating the file
// is how a test or the chaos suite aims a fault at a moment of its
// choosing, such as after a given training step:
//
//	{"device": 1, "xid": 79, "when_file": "/tmp/run7/gpu-fault-node2"}
//
// "hosts" gives sections for the hosts named (Options.Host): a section's
// "devices" or "events" replace the top level's for that host, and a list
// it leaves out is the top level's (so a section that removes devices gives
// events that fit what is left). Other hosts get the top level. Unknown
// fields, bad values (a when_file not absolute among them), events naming a
// device the host lacks and data after the object are errors naming the
// file and the problem, in every section, whichever host reads the file. The fake needs a cgo build, like NVML:
// without cgo, asking for it is an error (not [ErrNoDriver]).
package gpu
