package gpu_test

import (
	"fmt"

	"github.com/gorun/gorun/gpu"
)

// Four GPUs on two NUMA nodes, the allocation gave the agent three of
// them, and six local ranks share them round-robin.
func ExampleBind() {
	devs := []gpu.Device{
		{Index: 0, UUID: "GPU-0a1b2c3d-0000-4000-8000-000000000000", CPUs: []int{0, 1}},
		{Index: 1, UUID: "GPU-0a1b2c3d-0000-4000-8000-000000000001", CPUs: []int{0, 1}},
		{Index: 2, UUID: "GPU-5e6f7a8b-0000-4000-8000-000000000002", CPUs: []int{2, 3}},
		{Index: 3, UUID: "GPU-5e6f7a8b-0000-4000-8000-000000000003", CPUs: []int{2, 3}},
	}
	mine, err := gpu.Restrict(devs, "1,GPU-5e6f7a8b-0000-4000-8000-000000000003,2")
	if err != nil {
		fmt.Println(err)
		return
	}
	for r := range 6 {
		b, err := gpu.Bind(mine, r, 6, 0)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d: CUDA_VISIBLE_DEVICES=%s CPUs %v\n", r, b.VisibleDevices, b.CPUs)
	}
	_, err = gpu.Bind(mine, 0, 2, 2)
	fmt.Println(err)
	// Output:
	// rank 0: CUDA_VISIBLE_DEVICES=1 CPUs [0 1]
	// rank 1: CUDA_VISIBLE_DEVICES=3 CPUs [2 3]
	// rank 2: CUDA_VISIBLE_DEVICES=2 CPUs [2 3]
	// rank 3: CUDA_VISIBLE_DEVICES=1 CPUs [0 1]
	// rank 4: CUDA_VISIBLE_DEVICES=3 CPUs [2 3]
	// rank 5: CUDA_VISIBLE_DEVICES=2 CPUs [2 3]
	// gpu: 2 local ranks with 2 GPUs each need 4 GPUs; this host has 3
}
