package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testDevices returns n devices whose indices differ from their positions
// (as after Restrict), device i near CPUs 2i and 2i+1 and, when shared is
// true, CPU 100 too.
func testDevices(n int, shared bool) []Device {
	devs := make([]Device, n)
	for i := range devs {
		devs[i] = Device{Index: 10 + i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i), CPUs: []int{2 * i, 2*i + 1}}
		if shared {
			devs[i].CPUs = append(devs[i].CPUs, 100)
		}
	}
	return devs
}

// TestBind tries every local size 1-8, device count 0-8 and GPUs per rank
// 0-3 against Bind's definition.
func TestBind(t *testing.T) {
	for size := 1; size <= 8; size++ {
		for n := 0; n <= 8; n++ {
			for per := 0; per <= 3; per++ {
				t.Run(fmt.Sprintf("size%d/gpus%d/per%d", size, n, per), func(t *testing.T) {
					devs := testDevices(n, per > 0)
					used := map[int]int{}
					for r := range size {
						b, err := Bind(devs, r, size, per)
						if per > 0 && n > 0 && size*per > n {
							want := fmt.Sprintf("%d local ranks with %d GPUs each need %d GPUs; this host has %d", size, per, size*per, n)
							if err == nil || !strings.Contains(err.Error(), want) {
								t.Fatalf("rank %d: Bind = %+v, %v; want an error saying %q", r, b, err, want)
							}
							continue
						}
						if err != nil {
							t.Fatalf("rank %d: %v", r, err)
						}
						var want []Device
						switch {
						case n == 0:
						case per == 0:
							want = devs[r%n : r%n+1]
						default:
							want = devs[r*per : r*per+per]
						}
						checkBinding(t, r, b, want)
						for _, d := range b.Devices {
							used[d]++
						}
					}
					// Without sharing, no two ranks get one GPU.
					if per > 0 || size <= n {
						for d, k := range used {
							if k > 1 {
								t.Errorf("GPU %d given to %d ranks", d, k)
							}
						}
					}
				})
			}
		}
	}
}

func checkBinding(t *testing.T, r int, b Binding, want []Device) {
	t.Helper()
	if len(want) == 0 {
		if b.Devices != nil || b.VisibleDevices != "" || b.CPUs != nil {
			t.Fatalf("rank %d: Bind = %+v; want a zero Binding", r, b)
		}
		return
	}
	var idx []int
	var ids []string
	var cpus []int
	for _, d := range want {
		idx = append(idx, d.Index)
		ids = append(ids, strconv.Itoa(d.Index))
		cpus = append(cpus, d.CPUs...)
	}
	slices.Sort(cpus)
	cpus = slices.Compact(cpus)
	if !slices.Equal(b.Devices, idx) || b.VisibleDevices != strings.Join(ids, ",") || !slices.Equal(b.CPUs, cpus) {
		t.Fatalf("rank %d: Bind = %+v; want devices %v, CUDA_VISIBLE_DEVICES %q, CPUs %v", r, b, idx, strings.Join(ids, ","), cpus)
	}
}

func TestBindCPUs(t *testing.T) {
	devs := []Device{{Index: 0, CPUs: []int{4, 5}}, {Index: 1, CPUs: []int{0, 1, 4}}, {Index: 2}, {Index: 3, CPUs: []int{}}}
	tests := []struct {
		rank, size, per int
		want            []int
	}{
		{0, 2, 2, []int{0, 1, 4, 5}}, // union, ascending, without repeats
		{1, 2, 2, nil},               // GPU 2's CPUs are unknown: so are the rank's
		{3, 4, 0, nil},               // known to be none
		{5, 6, 0, []int{0, 1, 4}},    // round-robin: GPU 1
	}
	for _, tc := range tests {
		b, err := Bind(devs, tc.rank, tc.size, tc.per)
		if err != nil || !slices.Equal(b.CPUs, tc.want) || (tc.want == nil) != (b.CPUs == nil) {
			t.Errorf("Bind(rank %d of %d, %d per rank) = %+v, %v; want CPUs %v", tc.rank, tc.size, tc.per, b, err, tc.want)
		}
	}
}

func TestBindBadArguments(t *testing.T) {
	devs := testDevices(4, false)
	tests := []struct {
		rank, size, per int
		err             string
	}{
		{0, 0, 0, "local size 0"},
		{-1, 2, 0, "local rank -1: want 0 to 1"},
		{2, 2, 0, "local rank 2: want 0 to 1"},
		{0, 2, -1, "-1 GPUs per rank"},
		{0, 3, 2, "3 local ranks with 2 GPUs each need 6 GPUs; this host has 4"},
		{0, 2, int(^uint(0) >> 1), "this host has 4"},
	}
	for _, tc := range tests {
		b, err := Bind(devs, tc.rank, tc.size, tc.per)
		if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "gpu: ") {
			t.Errorf("Bind(rank %d of %d, %d per rank) = %+v, %v; want an error saying %q", tc.rank, tc.size, tc.per, b, err, tc.err)
		}
	}
	// Bad arguments are errors on a host without GPUs too.
	if _, err := Bind(nil, 0, 0, 0); err == nil {
		t.Error("Bind(nil, 0, 0, 0) gave no error")
	}
}

func TestRestrict(t *testing.T) {
	devs := []Device{
		{Index: 0, UUID: "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"},
		{Index: 1, UUID: "GPU-8932aaaa-0000-4000-8000-000000000001"},
		{Index: 2, UUID: "GPU-1c0ffee0-0000-4000-8000-000000000002"},
		{Index: 3, UUID: "GPU-deadbeef-0000-4000-8000-000000000003"},
	}
	tests := []struct {
		visible string
		want    []int // indices
		err     string
	}{
		{"", []int{0, 1, 2, 3}, ""},
		{"2", []int{2}, ""},
		{"3,1", []int{3, 1}, ""},
		{" 0 , 2 ", []int{0, 2}, ""},
		{"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", []int{0}, ""},
		{"GPU-deadbeef,GPU-1c", []int{3, 2}, ""},
		{"GPU-8932f,1", []int{0, 1}, ""},
		{"GPU-8932a,0,GPU-d", []int{1, 0, 3}, ""},
		{"4", nil, "no GPU 4 on this host (it has 4)"},
		{"0,7", nil, "no GPU 7"},
		{"-1", []int{}, ""},
		{"0,-1", nil, `"-1" is neither a GPU index nor a UUID`},
		{"+1", nil, `"+1" is neither`},
		{"NoDevFiles", []int{}, ""},
		{"0,NoDevFiles", nil, `"NoDevFiles" is neither`},
		{"gpu0", nil, `"gpu0" is neither`},
		{"0,,1", nil, "empty entry"},
		{"0,", nil, "empty entry"},
		{"GPU-8932", nil, `"GPU-8932" names both GPU-8932f937-d72c-4106-c12f-20bd9faed9f6 and GPU-8932aaaa`},
		{"GPU-ffff", nil, `no GPU of this host has a UUID starting "GPU-ffff"`},
		{"1,GPU-8932a", nil, `"GPU-8932a" names GPU 1 again`},
		{"2,2", nil, `"2" names GPU 2 again`},
		{"MIG-8932f937-d72c-4106-c12f-20bd9faed9f6", nil, "is a MIG device"},
	}
	for _, tc := range tests {
		t.Run(tc.visible, func(t *testing.T) {
			got, err := Restrict(devs, tc.visible)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q", tc.visible)) {
					t.Fatalf("Restrict = %v, %v; want an error saying %q", got, err, tc.err)
				}
				return
			}
			var idx []int
			for _, d := range got {
				idx = append(idx, d.Index)
			}
			if err != nil || !slices.Equal(idx, tc.want) {
				t.Fatalf("Restrict = %v, %v; want devices %v", idx, err, tc.want)
			}
		})
	}
	// Indices name devices by Index, not by position.
	got, err := Restrict(devs[2:], "3")
	if err != nil || len(got) != 1 || got[0].Index != 3 {
		t.Errorf("Restrict(devices 2 and 3, \"3\") = %v, %v; want device 3", got, err)
	}
}
