package gpu

import (
	"fmt"
	"strings"
	"testing"
)

func TestClassifyXID(t *testing.T) {
	tests := []struct {
		xid   uint64
		class Class
		what  string
	}{
		{8, Transient, "GPU stopped processing"},
		{11, Transient, "push buffer"},
		{13, Transient, "graphics engine exception"},
		{31, Transient, "MMU fault"},
		{43, Transient, "reset channel"},
		{45, Transient, "preemptive cleanup"},
		{46, Permanent, "GPU stopped processing"},
		{48, Permanent, "double-bit ECC"},
		{61, Permanent, "micro-controller"},
		{62, Permanent, "micro-controller halt"},
		{63, Permanent, "row remapping"},
		{64, Permanent, "failure"},
		{74, Permanent, "NVLink"},
		{79, Permanent, "GPU has fallen off the bus"},
		{92, Permanent, "high single-bit ECC error rate"},
		{94, Permanent, "contained ECC"},
		{95, Permanent, "uncontained ECC"},
		{119, Permanent, "GSP RPC timeout"},
		{120, Permanent, "GSP error"},
		{0, Unknown, "not in gorun's table"},
		{1, Unknown, "not in gorun's table"},
		{154, Unknown, "not in gorun's table"},
		{999, Unknown, "not in gorun's table"}, // NVML's "unknown XID"
		{1 << 63, Unknown, "not in gorun's table"},
	}
	listed := map[uint64]bool{}
	for _, tc := range tests {
		listed[tc.xid] = true
		t.Run(fmt.Sprint(tc.xid), func(t *testing.T) {
			class, detail := ClassifyXID(tc.xid)
			prefix := fmt.Sprintf("XID %d: ", tc.xid)
			if class != tc.class || !strings.HasPrefix(detail, prefix) || !strings.Contains(detail, tc.what) {
				t.Errorf("ClassifyXID(%d) = %v, %q; want %v, %q...%q", tc.xid, class, detail, tc.class, prefix, tc.what)
			}
		})
	}
	for xid := range xidTable {
		if !listed[xid] {
			t.Errorf("XID %d is in the table but not in this test", xid)
		}
	}
	if _, d := ClassifyXID(79); d != "XID 79: GPU has fallen off the bus" {
		t.Errorf("ClassifyXID(79) detail %q", d)
	}
}

func TestStrings(t *testing.T) {
	for c, want := range map[Class]string{Unknown: "unknown", Transient: "transient", Permanent: "permanent", 7: "Class(7)"} {
		if c.String() != want {
			t.Errorf("Class %d: %q, want %q", int(c), c, want)
		}
	}
	kinds := map[Kind]string{
		KindXID: "xid", KindECCSingleBit: "ecc-single-bit", KindECCDoubleBit: "ecc-double-bit",
		KindRetiredPagesPending: "retired-pages-pending", KindRowRemapPending: "row-remap-pending",
		KindRowRemapFailure: "row-remap-failure", KindClock: "clock", KindPower: "power", 42: "Kind(42)",
	}
	for k, want := range kinds {
		if k.String() != want {
			t.Errorf("Kind %d: %q, want %q", int(k), k, want)
		}
	}
}
