//go:build !linux || !cgo

package gpu

import "fmt"

func openNVML(Options) (Backend, error) {
	return nil, fmt.Errorf("%w: this gorun was built without cgo (or not for Linux), and NVML needs both", ErrNoDriver)
}

func openFake(opt Options) (Backend, error) {
	return nil, fmt.Errorf("gpu: fake GPUs %s: the fake backend runs NVML's code on go-nvml's mocks, which needs a cgo build (CGO_ENABLED=1) for Linux", opt.Fake)
}
