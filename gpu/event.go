package gpu

import (
	"fmt"
	"time"
)

// Class says what a health event calls for, after DEADPOOL's Table II
// (DESIGN.md §6).
type Class int

const (
	// Unknown: gorun does not know what the event means (an XID not in
	// its table). The zero Class. It is reported and the host stays:
	// should the event break the ranks, their failures decide (a rank
	// failing again and again stops the job, DESIGN.md §6).
	Unknown Class = iota
	// Transient: the device is sound; at most the process using it failed
	// (an application fault, a corrected error, a clock or power change).
	// The failed rank's own exit is the signal, and restarting it in place
	// is enough.
	Transient
	// Permanent: the device cannot be trusted until it is reset, repaired
	// or replaced (uncorrectable memory errors, a GPU off the bus, NVLink
	// or firmware failures). The host is replaced by a spare (hot-swap),
	// whether or not a rank has exited yet.
	Permanent
)

func (c Class) String() string {
	switch c {
	case Unknown:
		return "unknown"
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Kind is where a health event comes from.
type Kind int

const (
	// KindXID: an XID critical error (Event.XID), classified by [ClassifyXID].
	KindXID Kind = iota
	// KindECCSingleBit: a corrected single-bit ECC error. Transient.
	KindECCSingleBit
	// KindECCDoubleBit: an uncorrectable double-bit ECC error. Permanent.
	KindECCDoubleBit
	// KindRetiredPagesPending: a memory page was retired and the GPU must
	// be reset (or the driver reloaded) to stop using it (pre-Ampere GPUs).
	// Polled. Permanent.
	KindRetiredPagesPending
	// KindRowRemapPending: a memory row was marked for remapping, which
	// takes effect at the next GPU reset (Ampere and later). Polled.
	// Permanent.
	KindRowRemapPending
	// KindRowRemapFailure: a row could not be remapped (no spare row
	// left). Polled. Permanent.
	KindRowRemapFailure
	// KindClock: the device's clocks changed (for example throttling).
	// Transient.
	KindClock
	// KindPower: the device's power source changed. Transient.
	KindPower
)

func (k Kind) String() string {
	switch k {
	case KindXID:
		return "xid"
	case KindECCSingleBit:
		return "ecc-single-bit"
	case KindECCDoubleBit:
		return "ecc-double-bit"
	case KindRetiredPagesPending:
		return "retired-pages-pending"
	case KindRowRemapPending:
		return "row-remap-pending"
	case KindRowRemapFailure:
		return "row-remap-failure"
	case KindClock:
		return "clock"
	case KindPower:
		return "power"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one health event of one device.
type Event struct {
	Time   time.Time // when the backend received (or, for polled kinds, observed) it
	Device int       // the device's Index; -1 if NVML names a device it did not list at Open
	UUID   string
	Kind   Kind
	XID    uint64 // KindXID only
	Class  Class
	Detail string // for people: "XID 79: GPU has fallen off the bus"
}
