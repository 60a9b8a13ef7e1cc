package gpu

import "errors"

// ErrNoDriver: this host has no usable NVIDIA driver (libnvidia-ml.so.1 is
// not found, or the kernel driver is not loaded), or gorun was built
// without cgo, which NVML needs. Errors from [Open] wrap it with the
// reason; the caller runs CPU-only. Every other failure of Open is a real
// error.
var ErrNoDriver = errors.New("gpu: no NVIDIA driver")
