package gpu

import "fmt"

// xidTable classifies the XIDs gorun knows. An XID is an error report of
// the NVIDIA driver; NVML delivers it as an XID critical-error event.
//
// Sources:
//   - NVIDIA, "Xid Errors", https://docs.nvidia.com/deploy/xid-errors/, and
//     its Xid Catalog for Ampere and later GPUs,
//     https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
//     whose "Resolution Bucket (Immediate Action)" column decides the
//     class: RESTART_APP or IGNORE is Transient; RESET_GPU, RESTART_BM
//     (reboot) or CONTACT_SUPPORT on a used XID is Permanent.
//   - NVIDIA, "Dynamic Page Retirement",
//     https://docs.nvidia.com/deploy/dynamic-page-retirement/, for 48, 63, 64.
//   - DEADPOOL (../shared/papers) Table II for what each class calls for:
//     GPU memory and PCIe faults replace the node; transient faults are
//     recovered locally; unknown failures fall back to the operator.
//
// The rows, Transient (the GPU is sound; the application that used it
// failed, and restarting it is NVIDIA's immediate action):
//
//	 8  GPU stopped processing: a channel idle timeout (a kernel that never finishes)
//	11  invalid or corrupted push buffer stream (the application's command stream)
//	13  graphics engine exception: typically an out-of-bounds access or illegal instruction in a kernel
//	31  GPU memory page fault (MMU fault): the application touched an invalid address
//	43  GPU stopped processing: the application's channel was reset after a fault (reset channel verification error)
//	45  preemptive cleanup: the driver tore down a channel after earlier errors or a process exit or kill
//
// Permanent (the device must be reset, drained or replaced):
//
//	46  GPU stopped processing (NVIDIA Health Validation: critical, reset the GPU)
//	48  double-bit ECC error (DBE): uncorrectable, data in GPU memory was lost
//	61  internal micro-controller breakpoint or warning
//	62  internal micro-controller halt
//	63  ECC page retirement or row remapping recorded: takes effect only after a GPU reset
//	64  ECC page retirement or row remapping failed
//	74  NVLink error
//	79  GPU has fallen off the bus: unreachable over PCIe
//	92  high single-bit ECC error rate: the memory is wearing out
//	94  contained ECC error: uncorrectable; the affected process was killed, the row is remapped at the next reset
//	95  uncontained ECC error: uncorrectable, other processes may have read corrupt data
//	119 GSP RPC timeout: the GPU System Processor stopped answering the driver
//	120 GSP error: the GPU System Processor failed
//
// NVIDIA's immediate action for 94 is RESTART_APP, but the bad row stays in
// service until the GPU is reset, so a training job restarted in place on
// it would run on memory known to be faulty: gorun treats it like 95.
// Every other XID is Unknown.
var xidTable = map[uint64]xidInfo{
	8:  {Transient, "GPU stopped processing (channel idle timeout)"},
	11: {Transient, "invalid or corrupted push buffer stream"},
	13: {Transient, "graphics engine exception"},
	31: {Transient, "GPU memory page fault (MMU fault)"},
	43: {Transient, "GPU stopped processing (reset channel verification error)"},
	45: {Transient, "preemptive cleanup, due to previous errors"},

	46:  {Permanent, "GPU stopped processing"},
	48:  {Permanent, "double-bit ECC error"},
	61:  {Permanent, "internal micro-controller breakpoint/warning"},
	62:  {Permanent, "internal micro-controller halt"},
	63:  {Permanent, "ECC page retirement or row remapping recorded; reset the GPU"},
	64:  {Permanent, "ECC page retirement or row remapping failure"},
	74:  {Permanent, "NVLink error"},
	79:  {Permanent, "GPU has fallen off the bus"},
	92:  {Permanent, "high single-bit ECC error rate"},
	94:  {Permanent, "contained ECC error"},
	95:  {Permanent, "uncontained ECC error"},
	119: {Permanent, "GSP RPC timeout"},
	120: {Permanent, "GSP error"},
}

type xidInfo struct {
	class Class
	what  string
}

// ClassifyXID returns the class of an XID and a description for people,
// "XID 79: GPU has fallen off the bus". XIDs not in gorun's table (see the
// package documentation) are Unknown: "XID n: not in gorun's table".
func ClassifyXID(xid uint64) (Class, string) {
	info, ok := xidTable[xid]
	if !ok {
		return Unknown, fmt.Sprintf("XID %d: not in gorun's table", xid)
	}
	return info.class, fmt.Sprintf("XID %d: %s", xid, info.what)
}
