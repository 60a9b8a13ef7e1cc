package wire_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// Epoch tables that Validate or DecodeEpochTable rejects: tables made
// invalid field by field, and encodings altered byte by byte.

func TestEpochTableRejects(t *testing.T) {
	tab := func(f func(*wire.EpochTable)) *wire.EpochTable {
		t := clusterTable(2, 2, false)
		f(t)
		return t
	}
	// Tables that Encode writes faithfully but that are not valid.
	invalid := []struct {
		name string
		tab  *wire.EpochTable
	}{
		{"version 0", tab(func(t *wire.EpochTable) { t.Version = 0 })},
		{"version 2", tab(func(t *wire.EpochTable) { t.Version = wire.Version + 1 })},
		{"empty job", tab(func(t *wire.EpochTable) { t.Job = "" })},
		{"uppercase job", tab(func(t *wire.EpochTable) { t.Job = "JOB" })},
		{"job with dot", tab(func(t *wire.EpochTable) { t.Job = "a.b" })},
		{"world 0", table(0, nil)},
		{"world past MaxWorld", tab(func(t *wire.EpochTable) { t.World = wire.MaxWorld + 1 })},
		{"negative world", tab(func(t *wire.EpochTable) { t.World = -4 })},
		{"no hosts", table(1)},
		{"negative master port", tab(func(t *wire.EpochTable) { t.MasterPort = -1 })},
		{"master port 65536", tab(func(t *wire.EpochTable) { t.MasterPort = 65536 })},
		{"oversized host name", tab(func(t *wire.EpochTable) { t.Hosts[1].Name = tooLong })},
		{"oversized host address", tab(func(t *wire.EpochTable) { t.Hosts[0].Addr = tooLong })},
		{"duplicate rank across hosts", table(2, []int{0, 1}, []int{1})},
		{"spare with ranks", tab(func(t *wire.EpochTable) { t.Hosts[0].Spare = true })},
		{"fenced with ranks", tab(func(t *wire.EpochTable) { t.Hosts[1].Fenced = true })},
		{"resume step below -1", tab(func(t *wire.EpochTable) { t.G = -2 })},
		{"resume step past MaxStep", tab(func(t *wire.EpochTable) { t.G = wire.MaxStep + 1 })},
		{"holder rows out of order", tab(func(t *wire.EpochTable) {
			t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{2}}, {Rank: 0, Holders: []int{2}}}
		})},
		{"two holder rows of a rank", tab(func(t *wire.EpochTable) {
			t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{2}}, {Rank: 1, Holders: []int{3}}}
		})},
		{"holder row past world", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 4, Holders: []int{2}}} })},
		{"rank its own holder", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{1}}} })},
		{"holder twice", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 0, Holders: []int{2, 2}}} })},
		{"holder past world", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 0, Holders: []int{9}}} })},
		{"holder row without holders", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 0}} })},
		{"restore rows out of order", tab(func(t *wire.EpochTable) {
			t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 0, Params: 3}, {Rank: 1, Opt: 3, Params: 0}}
		})},
		{"restore from itself", tab(func(t *wire.EpochTable) { t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 2, Params: 3}} })},
		{"restore source past world", tab(func(t *wire.EpochTable) { t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 0, Params: 4}} })},
		{"duplicate rank across hosts, world not full", table(3, []int{0, 1}, []int{1, 2})},
		{"duplicate rank in a host", table(2, []int{0, 0})},
		{"missing rank", table(3, []int{0}, []int{2})},
		{"all ranks missing", table(2, nil, nil)},
		{"rank past world", table(2, []int{0, 1}, []int{2})},
		{"too many ranks", table(2, []int{0, 1, 2})},
		{"range past world", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(2, 3, 1)} })},
		{"zero count", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(2, 2, 1), rr(0, 0, 1)} })},
		{"zero stride", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(2, 2, 0)} })},
		{"negative first", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(-1, 1, 1)} })},
		{"decode without erasure code", tab(func(t *wire.EpochTable) {
			t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 0, Params: 3, Decode: true}}
		})},
		{"decode from itself without erasure code", tab(func(t *wire.EpochTable) {
			t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 2, Params: 3, Decode: true}}
		})},
		{"ec K 0", ecTab(func(_ *wire.EpochTable, ec *wire.ECTable, g *wire.ECGroupRow) {
			ec.K, g.Data, g.Parity, g.DataGroups = 0, nil, []int{0, 1, 2, 3}, nil
		})},
		{"ec M 0", ecTab(func(_ *wire.EpochTable, ec *wire.ECTable, g *wire.ECGroupRow) {
			ec.K, ec.M, g.Data, g.Parity = 4, 0, []int{0, 1, 2, 3}, nil
		})},
		{"ec K+M past 256", ecTab(func(_ *wire.EpochTable, ec *wire.ECTable, _ *wire.ECGroupRow) { ec.K = 255 })},
		{"ec without groups", ecTab(func(_ *wire.EpochTable, ec *wire.ECTable, _ *wire.ECGroupRow) { ec.Groups = nil })},
		{"ec group of 3 hosts", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.Hosts = g.Hosts[:3] })},
		{"ec group of 5 hosts", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.Hosts = append(g.Hosts, 4) })},
		{"ec host twice in Hosts, once in the roles", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.Hosts[3] = 0 })},
		{"ec host past the table", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.Hosts[3], g.Parity[1] = 5, 5
		})},
		{"ec negative host", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.Hosts[3], g.Parity[1] = -1, -1
		})},
		{"ec idle spare in a group", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.Hosts[3], g.Parity[1] = 4, 4
		})},
		{"ec data host also parity", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.Parity[0] = 0 })},
		{"ec data host out of the group", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.Data[1] = 4 })},
		{"ec parity host out of range", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.Parity[1] = 7 })},
		{"ec one data group", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.DataGroups = [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
		})},
		{"ec data groups of unequal length", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.DataGroups = [][]int{{0, 1, 2}, {3, 4, 5, 6, 7}}
		})},
		{"ec empty data groups", ecTab(func(t *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.DataGroups = [][]int{{}, {}} })},
		{"ec rank in two data groups", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.DataGroups[1][0] = 0 })},
		{"ec rank past world", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.DataGroups[1][3] = 8 })},
		{"ec negative rank", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) { g.DataGroups[1][3] = -1 })},
		{"ec rank in no data group", func() *wire.EpochTable {
			t := table(10, []int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}, []int{8, 9})
			t.EC = ecTable().EC
			return t
		}()},
		{"ec host in two groups, roles not its places", func() *wire.EpochTable {
			t := ecOtherGroupTable()
			t.EC.Groups[0].Parity = []int{1, 5} // host 5 twice, host 3 never
			return t
		}()},
		{"ec doubled place, roles not its places", func() *wire.EpochTable {
			t := ecFreeSlotsTable()
			t.EC.Groups[0].Parity = []int{2, 3} // host 2 twice, host 1 once
			return t
		}()},
		{"ec doubled place in the roles only", func() *wire.EpochTable {
			t := ecFreeSlotsTable()
			t.EC.Groups[0].Hosts = []int{0, 1, 2, 3}
			return t
		}()},
		{"ec doubled place, a rank in two data groups", func() *wire.EpochTable {
			t := ecFreeSlotsTable()
			t.EC.Groups[0].DataGroups[1][0] = 0
			return t
		}()},
		{"ec doubled place past the table", func() *wire.EpochTable {
			t := ecFreeSlotsTable()
			g := &t.EC.Groups[0]
			g.Hosts[1], g.Parity[0] = 4, 4
			return t
		}()},
		{"ec doubled place, more groups than hosts allow", func() *wire.EpochTable {
			t := ecFreeSlotsTable()
			t.EC.Groups = append(t.EC.Groups, t.EC.Groups[0])
			return t
		}()},
		{"log rows without erasure code", tab(func(t *wire.EpochTable) {
			t.Logs = []wire.HolderRow{{Rank: 0, Holders: []int{2}}}
		})},
		{"log rows out of order", logTab(func(t *wire.EpochTable) { t.Logs[0], t.Logs[1] = t.Logs[1], t.Logs[0] })},
		{"two log rows of a rank", logTab(func(t *wire.EpochTable) { t.Logs[1].Rank = 0 })},
		{"log row past world", logTab(func(t *wire.EpochTable) { t.Logs[7].Rank = 8 })},
		{"negative log row", logTab(func(t *wire.EpochTable) { t.Logs[0].Rank = -1 })},
		{"more log rows than ranks", logTab(func(t *wire.EpochTable) {
			t.Logs = append(t.Logs, wire.HolderRow{Rank: 8, Holders: []int{0}})
		})},
		{"rank its own log holder", logTab(func(t *wire.EpochTable) { t.Logs[2].Holders[0] = 2 })},
		{"log holder twice", logTab(func(t *wire.EpochTable) { t.Logs[0].Holders[1] = 2 })},
		{"log holder past world", logTab(func(t *wire.EpochTable) { t.Logs[3].Holders[0] = 8 })},
		{"negative log holder", logTab(func(t *wire.EpochTable) { t.Logs[3].Holders[0] = -1 })},
		{"log row without holders", logTab(func(t *wire.EpochTable) { t.Logs[3].Holders = nil })},
		{"coded base below -1", logTab(func(t *wire.EpochTable) { t.G, t.H = 10, -2 })},
		{"coded base past G", logTab(func(t *wire.EpochTable) { t.G, t.H = 10, 11 })},
		{"coded base without G", logTab(func(t *wire.EpochTable) { t.G, t.H = -1, 3 })},
		{"coded base past MaxStep", logTab(func(t *wire.EpochTable) { t.H = wire.MaxStep + 1 })},
		{"ec more groups than hosts allow", func() *wire.EpochTable {
			t := ecTable()
			t.EC.Groups = append(t.EC.Groups, t.EC.Groups[0])
			return t
		}()},
	}
	// Tables that Encode cannot write as they are (its format has K data
	// and M parity hosts per group) and that are not valid.
	unencodable := []struct {
		name string
		tab  *wire.EpochTable
	}{
		{"ec one data host", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.Data, g.Parity = []int{0}, []int{1, 2, 3}
		})},
		{"ec three data hosts", ecTab(func(_ *wire.EpochTable, _ *wire.ECTable, g *wire.ECGroupRow) {
			g.Data, g.Parity = []int{0, 1, 2}, []int{3}
		})},
	}
	for _, tc := range append(invalid, unencodable...) {
		t.Run("Validate/"+tc.name, func(t *testing.T) {
			if err := tc.tab.Validate(); !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("Validate() = %v, want ErrMalformed", err)
			}
		})
	}
	cases := make([]rejectCase, 0, len(invalid))
	for _, tc := range invalid {
		cases = append(cases, rejectCase{tc.name, tc.tab.Encode()})
	}

	valid := clusterTable(2, 2, false).Encode()
	header := func(fields ...uint64) []byte {
		b := []byte{'T', 5}
		for _, f := range fields {
			b = binary.AppendUvarint(b, f)
		}
		return b
	}
	overflow := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}
	cases = append(cases,
		rejectCase{"empty input", nil},
		rejectCase{"magic only", []byte{'T'}},
		rejectCase{"bad magic", append([]byte{'J'}, valid[1:]...)},
		rejectCase{"json", wire.Marshal(clusterTable(2, 2, false))},
		rejectCase{"format 0", append([]byte{'T', 0}, valid[2:]...)},
		rejectCase{"format 1 (without replica ports)", append([]byte{'T', 1}, valid[2:]...)},
		rejectCase{"format 2 (without membership)", append([]byte{'T', 2}, valid[2:]...)},
		rejectCase{"format 3 (without erasure coding)", append([]byte{'T', 3}, valid[2:]...)},
		rejectCase{"format 4 (without diff mode's logs)", append([]byte{'T', 4}, valid[2:]...)},
		rejectCase{"format 6", append([]byte{'T', 6}, valid[2:]...)},
		rejectCase{"log row count past input", append(valid[:len(valid)-2:len(valid)-2], 50, 0, 1)},
		rejectCase{"log holder count past MaxHolders", append(valid[:len(valid)-2:len(valid)-2], append(append([]byte{1, 0}, binary.AppendUvarint(nil, wire.MaxHolders+1)...), make([]byte, 40)...)...)},
		rejectCase{"coded base step past MaxStep", binary.AppendUvarint(valid[:len(valid)-1:len(valid)-1], wire.MaxStep+2)},
		rejectCase{"restore flag 2", ecRestoreFlags(2)},
		rejectCase{"ec K 256", ecSection(256)},
		rejectCase{"ec M past 256-K", ecSection(2, 255)},
		rejectCase{"ec group count past input", ecSection(2, 2, 1000)},
		rejectCase{"ec group count past hosts", append(ecSection(1, 1, 5), make([]byte, 30)...)},
		rejectCase{"ec host past hosts", ecSection(2, 2, 1, 0, 1, 2, 9, 0, 0, 0, 0, 0, 0, 0)},
		rejectCase{"ec data group length past world", ecSection(2, 2, 1, 0, 1, 2, 3, 0, 2, 1, 3, 9, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)},
		rejectCase{"ec data groups past input", ecSection(2, 2, 1, 0, 1, 2, 3, 0, 2, 1, 3, 8, 0, 1, 2, 3, 4, 5, 6, 7)},
		rejectCase{"trailing byte", append(valid[:len(valid):len(valid)], 0)},
		rejectCase{"varint overflow", append(header(1, 0), overflow...)},
		rejectCase{"job longer than MaxStringLen", append(header(1, 0, 1, wire.MaxStringLen+1), tooLong...)},
		rejectCase{"job length past end", append(header(1, 0, 1, 10), "job"...)},
		rejectCase{"host count past input", append(appendStrs(header(1, 0, 1), "j", ""), 0, 50, 0, 0, 0)},
		rejectCase{"host count past MaxHosts", append(binary.AppendUvarint(append(appendStrs(header(1, 0, 1), "j", ""), 0), wire.MaxHosts+1), make([]byte, 4*(wire.MaxHosts+1))...)},
		rejectCase{"range count past input", append(appendStrs(header(1, 0, 1), "j", ""), 0, 1, 0, 0, 0, 40, 0, 1, 1)},
		rejectCase{"rank past MaxWorld", binary.AppendUvarint(append(appendStrs(header(1, 0, 1), "j", ""), 0, 1, 0, 0, 0, 1, 0, 1), wire.MaxWorld+1)},
	)
	// Every proper prefix of a valid encoding is truncated.
	for n := range len(valid) {
		cases = append(cases, rejectCase{fmt.Sprintf("truncated to %d", n), valid[:n]})
	}
	testRejects(t, wire.DecodeEpochTable, cases)
}

// appendStrs appends each s as uvarint(len) and its bytes.
func appendStrs(b []byte, ss ...string) []byte {
	for _, s := range ss {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func TestEpochTableValidateTooManyHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MaxHosts hosts")
	}
	tab := table(1, []int{0})
	tab.Hosts = append(tab.Hosts, make([]wire.TableHost, wire.MaxHosts)...)
	if err := tab.Validate(); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("Validate() with %d hosts = %v, want ErrMalformed", len(tab.Hosts), err)
	}
}

// ecSection returns the encoding of a table with world 8 on 4 hosts of 2
// ranks whose erasure-coding section is fields (K, M, ngroups, ...).
func ecSection(fields ...uint64) []byte {
	t := clusterTable(4, 2, false)
	b := t.Encode()
	b = b[:len(b)-1] // K = 0
	for _, f := range fields {
		b = binary.AppendUvarint(b, f)
	}
	return b
}

// ecRestoreFlags returns the encoding of a table with one restore row whose
// flags are flags.
func ecRestoreFlags(flags uint64) []byte {
	t := ecTable()
	t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 0, Params: 3}}
	b := t.Encode()
	ec := t.EC
	t.EC = nil
	noEC := t.Encode()
	t.EC = ec
	// noEC ends with the restore row's flags (0) and K (0).
	out := append([]byte(nil), noEC[:len(noEC)-2]...)
	out = binary.AppendUvarint(out, flags)
	return append(out, b[len(noEC)-1:]...)
}
