package gpu

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Binding is what a local rank gets: its GPUs and the CPUs near them.
type Binding struct {
	Devices        []int  // NVML indices (Device.Index)
	VisibleDevices string // CUDA_VISIBLE_DEVICES value: the indices, comma-separated
	CPUs           []int  // union of the devices' CPUs, ascending (nil if any device's are unknown)
}

// Bind gives local rank localRank of localSize its devices among devs.
// gpusPerRank 0 means one GPU per rank, shared round-robin when ranks
// outnumber GPUs (rank r gets devs[r mod len(devs)]). gpusPerRank G >= 1
// gives rank r devs[r*G : r*G+G], and is an error when the host has fewer
// than localSize*G devices. Without devices, Bind returns a zero Binding and
// no error: the rank runs CPU-only.
//
// VisibleDevices holds NVML indices, which count in PCI bus order; CUDA
// counts the same way only with CUDA_DEVICE_ORDER=PCI_BUS_ID, which the
// rank's environment should then carry.
func Bind(devs []Device, localRank, localSize, gpusPerRank int) (Binding, error) {
	switch {
	case localSize < 1:
		return Binding{}, fmt.Errorf("gpu: local size %d: want at least 1", localSize)
	case localRank < 0 || localRank >= localSize:
		return Binding{}, fmt.Errorf("gpu: local rank %d: want 0 to %d", localRank, localSize-1)
	case gpusPerRank < 0:
		return Binding{}, fmt.Errorf("gpu: %d GPUs per rank: want 0 or more", gpusPerRank)
	}
	n := len(devs)
	if n == 0 {
		return Binding{}, nil
	}
	var mine []Device
	if gpusPerRank == 0 {
		mine = devs[localRank%n : localRank%n+1]
	} else {
		if localSize > n/gpusPerRank {
			return Binding{}, fmt.Errorf("gpu: %d local ranks with %d GPUs each need %d GPUs; this host has %d",
				localSize, gpusPerRank, int64(localSize)*int64(gpusPerRank), n)
		}
		mine = devs[localRank*gpusPerRank : (localRank+1)*gpusPerRank]
	}
	b := Binding{Devices: make([]int, len(mine))}
	ids := make([]string, len(mine))
	cpusKnown := true
	for i, d := range mine {
		b.Devices[i] = d.Index
		ids[i] = strconv.Itoa(d.Index)
		cpusKnown = cpusKnown && d.CPUs != nil
		b.CPUs = append(b.CPUs, d.CPUs...)
	}
	b.VisibleDevices = strings.Join(ids, ",")
	if cpusKnown {
		slices.Sort(b.CPUs)
		b.CPUs = slices.Compact(b.CPUs)
	} else {
		b.CPUs = nil
	}
	return b, nil
}

// Restrict keeps the devices named by a CUDA_VISIBLE_DEVICES value already
// set for the agent, in the value's order: for allocations such as Slurm's
// gres. The value is a comma-separated list whose entries are NVML indices
// ("0,2"), UUIDs ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"), or UUID
// prefixes that name one device ("GPU-8932f937"), as CUDA accepts. ""
// keeps all devices; "NoDevFiles" (Slurm's value for a job without GPUs)
// and "-1" keep none. An entry that names no device, several devices, or a
// device already named is an error; so are MIG device entries, which gorun
// does not bind.
func Restrict(devs []Device, visible string) ([]Device, error) {
	switch strings.TrimSpace(visible) {
	case "":
		return slices.Clone(devs), nil
	case "NoDevFiles", "-1":
		return nil, nil
	}
	var out []Device
	for entry := range strings.SplitSeq(visible, ",") {
		entry = strings.TrimSpace(entry)
		i, err := lookup(devs, entry)
		if err != nil {
			return nil, fmt.Errorf("gpu: CUDA_VISIBLE_DEVICES=%q: %w", visible, err)
		}
		if slices.ContainsFunc(out, func(d Device) bool { return d.Index == devs[i].Index }) {
			return nil, fmt.Errorf("gpu: CUDA_VISIBLE_DEVICES=%q: %q names GPU %d again", visible, entry, devs[i].Index)
		}
		out = append(out, devs[i])
	}
	return out, nil
}

// lookup returns the position in devs of the device that entry names.
func lookup(devs []Device, entry string) (int, error) {
	if entry == "" {
		return 0, errors.New("empty entry")
	}
	if strings.HasPrefix(entry, "GPU-") {
		found := -1
		for i, d := range devs {
			if strings.HasPrefix(d.UUID, entry) {
				if found >= 0 {
					return 0, fmt.Errorf("%q names both %s and %s", entry, devs[found].UUID, d.UUID)
				}
				found = i
			}
		}
		if found < 0 {
			return 0, fmt.Errorf("no GPU of this host has a UUID starting %q", entry)
		}
		return found, nil
	}
	if strings.HasPrefix(entry, "MIG-") {
		return 0, fmt.Errorf("%q is a MIG device: gorun binds whole GPUs only", entry)
	}
	idx, err := strconv.Atoi(entry)
	if err != nil || idx < 0 || entry[0] == '+' {
		return 0, fmt.Errorf("%q is neither a GPU index nor a UUID (GPU-...)", entry)
	}
	i := slices.IndexFunc(devs, func(d Device) bool { return d.Index == idx })
	if i < 0 {
		return 0, fmt.Errorf("no GPU %d on this host (it has %d)", idx, len(devs))
	}
	return i, nil
}
