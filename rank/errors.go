package rank

import (
	"fmt"

	"github.com/gorun/gorun/ckpt"
)

// CorruptError says that a rank's committed state changed in memory after
// it was committed (memory corruption, or a write through the read-write
// views into a committed slot): its bytes no longer match the CRC32Cs
// taken at commit. The step can never be replicated, so it can never
// become recoverable everywhere, and the job cannot go on without failing
// the rank (HostConfig.Failed). It matches ckpt.ErrCorrupt.
type CorruptError struct {
	Rank   int
	Step   int64
	Region string
	Sum    uint32 // the region's CRC32C as committed
	Got    uint32 // its bytes' CRC32C now
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("state of rank %d corrupted in memory: step %d, CRC mismatch in region %s (CRC32C %08x, committed %08x)",
		e.Rank, e.Step, e.Region, e.Got, e.Sum)
}

func (e *CorruptError) Unwrap() error { return ckpt.ErrCorrupt }
