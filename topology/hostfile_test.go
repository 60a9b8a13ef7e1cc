package topology

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// hostAt builds a Host defined at line n of file "t".
func hostAt(name string, slots, line int) Host {
	return Host{Name: name, Slots: slots, Source: "t:" + itoa(line)}
}

func itoa(n int) string {
	if n < 0 {
		return "-" + itoa(-n)
	}
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func with(h Host, f func(*Host)) Host { f(&h); return h }

func TestParseHostfile(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Host
	}{
		{"bare name gives one slot", "node1\n", []Host{hostAt("node1", 1, 1)}},
		{"openmpi slots", "node1 slots=4\n", []Host{hostAt("node1", 4, 1)}},
		{"openmpi slots and max_slots", "node1 slots=4 max_slots=8",
			[]Host{with(hostAt("node1", 4, 1), func(h *Host) { h.MaxSlots = 8 })}},
		{"max_slots alone keeps one slot", "node1 max_slots=3",
			[]Host{with(hostAt("node1", 1, 1), func(h *Host) { h.MaxSlots = 3 })}},
		{"attribute order is free", "node1 max_slots=8 slots=4",
			[]Host{with(hostAt("node1", 4, 1), func(h *Host) { h.MaxSlots = 8 })}},
		{"mpich form", "node1:4\n", []Host{hostAt("node1", 4, 1)}},
		{"mpich form with max_slots", "node1:4 max_slots=6",
			[]Host{with(hostAt("node1", 4, 1), func(h *Host) { h.MaxSlots = 6 })}},
		{"comment lines and blank lines", "# header\n\n   \n\t# indented\nnode1\n\n",
			[]Host{hostAt("node1", 1, 5)}},
		{"trailing comment", "node1 slots=2 # two GPUs\n", []Host{hostAt("node1", 2, 1)}},
		{"comment glued to a token", "node1#slots=9\n", []Host{hostAt("node1", 1, 1)}},
		{"comment cuts attributes", "node1 slots=2 #rack=r9\n", []Host{hostAt("node1", 2, 1)}},
		{"crlf line endings", "node1 slots=2\r\nnode2\r\n", []Host{hostAt("node1", 2, 1), hostAt("node2", 1, 2)}},
		{"no final newline", "node1\nnode2", []Host{hostAt("node1", 1, 1), hostAt("node2", 1, 2)}},
		{"tabs between fields", "node1\tslots=2\t\track=r1",
			[]Host{with(hostAt("node1", 2, 1), func(h *Host) { h.Rack = "r1" })}},
		{"rack and switch", "node1 rack=r1 switch=s3",
			[]Host{with(hostAt("node1", 1, 1), func(h *Host) { h.Rack, h.Switch = "r1", "s3" })}},
		{"label characters", "node1 rack=row-2/r_1.a:b",
			[]Host{with(hostAt("node1", 1, 1), func(h *Host) { h.Rack = "row-2/r_1.a:b" })}},
		{"spare", "node9 spare", []Host{with(hostAt("node9", 1, 1), func(h *Host) { h.Spare = true })}},
		{"spare with slots", "node9:8 spare rack=r2",
			[]Host{with(hostAt("node9", 8, 1), func(h *Host) { h.Spare, h.Rack = true, "r2" })}},
		{"host named spare", "spare slots=2", []Host{hostAt("spare", 2, 1)}},
		{"fqdn and underscore", "gpu_01.cluster.example.org slots=2",
			[]Host{hostAt("gpu_01.cluster.example.org", 2, 1)}},
		{"ipv4", "10.0.0.1:2", []Host{hostAt("10.0.0.1", 2, 1)}},
		{"ipv6 in brackets", "[fd00::1]", []Host{hostAt("fd00::1", 1, 1)}},
		{"ipv6 with slots", "[fd00::1]:4 rack=r1",
			[]Host{with(hostAt("fd00::1", 4, 1), func(h *Host) { h.Rack = "r1" })}},
		{"ipv6 with slots=", "[::1] slots=3", []Host{hostAt("::1", 3, 1)}},
		{"slurm node list", "node[01-03] slots=2 rack=r1", []Host{
			with(hostAt("node01", 2, 1), func(h *Host) { h.Rack = "r1" }),
			with(hostAt("node02", 2, 1), func(h *Host) { h.Rack = "r1" }),
			with(hostAt("node03", 2, 1), func(h *Host) { h.Rack = "r1" }),
		}},
		{"slurm node list mpich slots", "gpu[1,3]:8", []Host{hostAt("gpu1", 8, 1), hostAt("gpu3", 8, 1)}},
		{"slurm node list spare", "sp[1-2] spare", []Host{
			with(hostAt("sp1", 1, 1), func(h *Host) { h.Spare = true }),
			with(hostAt("sp2", 1, 1), func(h *Host) { h.Spare = true }),
		}},
		{"top-level comma list", "a,b[1-2] slots=2", []Host{hostAt("a", 2, 1), hostAt("b1", 2, 1), hostAt("b2", 2, 1)}},
		{"comma list with own counts", "a:2,b", []Host{hostAt("a", 2, 1), hostAt("b", 1, 1)}},
		{"max slots on every expanded host", "n[1-2]:2 max_slots=4", []Host{
			with(hostAt("n1", 2, 1), func(h *Host) { h.MaxSlots = 4 }),
			with(hostAt("n2", 2, 1), func(h *Host) { h.MaxSlots = 4 }),
		}},
		{"largest slot count", "n slots=1048576", []Host{hostAt("n", 1<<20, 1)}},
		{"leading zeros in count", "n slots=007", []Host{hostAt("n", 7, 1)}},
		{"order of first appearance", "b\na\nc\n", []Host{hostAt("b", 1, 1), hostAt("a", 1, 2), hostAt("c", 1, 3)}},
		{"case matters", "Node1\nnode1\n", []Host{hostAt("Node1", 1, 1), hostAt("node1", 1, 2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHostfile(strings.NewReader(tt.in), "t")
			if err != nil {
				t.Fatalf("ParseHostfile(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseHostfile(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseHostfileMerge(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Host
	}{
		{"slots add up", "a slots=2\nb\na slots=3\n", []Host{hostAt("a", 5, 1), hostAt("b", 1, 2)}},
		{"default slots add up", "a\na\na\n", []Host{hostAt("a", 3, 1)}},
		{"mpich and openmpi lines add up", "a:2\na slots=4\n", []Host{hostAt("a", 6, 1)}},
		{"max_slots add up", "a slots=2 max_slots=3\na slots=1 max_slots=5\n",
			[]Host{with(hostAt("a", 3, 1), func(h *Host) { h.MaxSlots = 8 })}},
		{"rack given once applies", "a\na rack=r1\na\n",
			[]Host{with(hostAt("a", 3, 1), func(h *Host) { h.Rack = "r1" })}},
		{"same rack repeated", "a rack=r1 switch=s1\na rack=r1 switch=s1\n",
			[]Host{with(hostAt("a", 2, 1), func(h *Host) { h.Rack, h.Switch = "r1", "s1" })}},
		{"spare on every line", "s spare\ns:2 spare\n",
			[]Host{with(hostAt("s", 3, 1), func(h *Host) { h.Spare = true })}},
		{"node list overlaps single host", "n[1-2]\nn2:3\n", []Host{hostAt("n1", 1, 1), hostAt("n2", 4, 1)}},
		{"repeat inside one node list", "n[1,1,2]", []Host{hostAt("n1", 2, 1), hostAt("n2", 1, 1)}},
		{"repeat inside one comma list", "a,a:3", []Host{hostAt("a", 4, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHostfile(strings.NewReader(tt.in), "t")
			if err != nil {
				t.Fatalf("ParseHostfile(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseHostfile(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseHostfileErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		line int
		kind error
		msg  string // substring of the error text
	}{
		// Whole-file errors.
		{"empty file", "", 0, ErrNoHosts, "no hosts"},
		{"only comments", "# nothing\n\n  # here\n", 0, ErrNoHosts, "no hosts"},

		// Keys and attributes.
		{"unknown key", "a slots=2 cores=4", 1, ErrSyntax, `unknown key "cores"`},
		{"unknown key on later line", "a\nb\nc fast=yes", 3, ErrSyntax, `unknown key "fast"`},
		{"upper-case key", "a Slots=2", 1, ErrSyntax, `unknown key "Slots"`},
		{"dash key", "a max-slots=2", 1, ErrSyntax, `unknown key "max-slots"`},
		{"unknown bare word", "a fast", 1, ErrSyntax, `unknown attribute "fast"`},
		{"colon attribute", "a slots:4", 1, ErrSyntax, `unknown attribute "slots:4"; attributes are written key=value`},
		{"key without value", "a slots", 1, ErrSyntax, "slots needs a value"},
		{"missing key", "a =4", 1, ErrSyntax, `missing key before '=' in "=4"`},
		{"spare with value", "a spare=yes", 1, ErrSyntax, "spare takes no value"},
		{"duplicate slots", "a slots=2 slots=3", 1, ErrSyntax, `duplicate key "slots"`},
		{"duplicate rack", "a rack=r1 rack=r1", 1, ErrSyntax, `duplicate key "rack"`},
		{"duplicate spare", "a spare spare", 1, ErrSyntax, `duplicate key "spare"`},
		{"empty slots", "a slots=", 1, ErrSyntax, `empty value for "slots"`},
		{"empty max_slots", "a max_slots=", 1, ErrSyntax, `empty value for "max_slots"`},
		{"empty rack", "a rack=", 1, ErrSyntax, `empty value for "rack"`},
		{"empty switch", "a switch=", 1, ErrSyntax, `empty value for "switch"`},
		{"attribute first", "slots=4 a", 1, ErrSyntax, `line starts with "slots=4"; the host name must come first`},
		{"mpich and slots=", "a:4 slots=2", 1, ErrSyntax, `slots given twice: "a:4" and slots=2`},
		{"mpich list and slots=", "a,b:4 slots=2", 1, ErrSyntax, `slots given twice: "b:4" and slots=2`},
		{"rack bad character", "a rack=r1,r2", 1, ErrBadValue, `invalid character ',' in rack label "r1,r2"`},
		{"switch bad character", "a switch=s$", 1, ErrBadValue, `invalid character '$' in switch label`},
		{"rack too long", "a rack=" + strings.Repeat("r", 256), 1, ErrBadValue, "longer than 255 bytes"},

		// Numbers.
		{"zero slots", "a slots=0", 1, ErrBadValue, `slots must be between 1 and 1048576, got "0"`},
		{"negative slots", "a slots=-1", 1, ErrBadValue, `slots "-1" is not a positive integer`},
		{"plus slots", "a slots=+1", 1, ErrBadValue, "not a positive integer"},
		{"word slots", "a slots=four", 1, ErrBadValue, `slots "four" is not a positive integer`},
		{"hex slots", "a slots=0x10", 1, ErrBadValue, "not a positive integer"},
		{"huge slots", "a slots=1048577", 1, ErrBadValue, `got "1048577"`},
		{"overflowing slots", "a slots=99999999999999999999999", 1, ErrBadValue, "must be between 1 and 1048576"},
		{"zero max_slots", "a max_slots=0", 1, ErrBadValue, `max_slots must be between 1 and 1048576, got "0"`},
		{"max_slots below slots", "a slots=4 max_slots=2", 1, ErrBadValue, "max_slots=2 is less than slots 4"},
		{"max_slots below mpich slots", "a:4 max_slots=3", 1, ErrBadValue, "max_slots=3 is less than slots 4"},
		{"zero mpich slots", "a:0", 1, ErrBadValue, `slot count must be between 1 and 1048576, got "0"`},
		{"empty mpich slots", "a:", 1, ErrSyntax, "empty slot count"},
		{"word mpich slots", "a:x", 1, ErrBadValue, `slot count "x" is not a positive integer`},
		{"merged slots too many", "a slots=1048576\na", 2, ErrBadValue, `host "a": slots add up to more than 1048576 (first defined at t:1)`},

		// Host names.
		{"missing host before colon", ":4", 1, ErrBadHostName, "missing host name before ':'"},
		{"bad character", "no$de slots=2", 1, ErrBadHostName, `invalid character '$' in host name "no$de"`},
		{"user at host", "me@node1", 1, ErrBadHostName, `invalid character '@'`},
		{"leading dash", "-oProxyCommand=x", 1, ErrSyntax, "host name must come first"},
		{"leading dash name", "-node", 1, ErrBadHostName, "starting or ending with '-'"},
		{"trailing dot", "node.", 1, ErrBadHostName, "empty label"},
		{"double dot", "a..b", 1, ErrBadHostName, "empty label"},
		{"label too long", strings.Repeat("a", 64) + ".b", 1, ErrBadHostName, "label longer than 63 bytes"},
		{"name too long", strings.Repeat("a.", 127) + "bb", 1, ErrBadHostName, "longer than 253 bytes"},
		{"bad ipv4", "10.0.0.256", 1, ErrBadHostName, "not a valid IPv4 address"},
		{"numeric name", "1234", 1, ErrBadHostName, `"1234" is all digits`},
		{"octal-looking ipv4", "010.0.0.1", 1, ErrBadHostName, "not a valid IPv4"},
		{"unbracketed ipv6", "fd00::1", 1, ErrBadHostName, "write IPv6 addresses in brackets"},
		{"bad ipv6", "[fd00::zz]", 1, ErrBadHostName, `invalid IPv6 address "fd00::zz"`},
		{"ipv4 in ipv6 brackets", "[1.2.3.4:5]", 1, ErrBadHostName, "invalid IPv6 address"},
		{"junk after ipv6", "[::1]x", 1, ErrSyntax, `unexpected "x" after IPv6 address [::1]`},
		{"non-ascii name", "nöde", 1, ErrBadHostName, "invalid character"},
		{"control character", "no\x00de", 1, ErrBadHostName, `invalid character '\x00'`},
		{"empty entry in list", "a,,b", 1, ErrBadNodeList, "empty entry"},
		{"trailing comma", "a,", 1, ErrBadNodeList, "empty entry at end"},

		// Node lists.
		{"unclosed bracket", "node[1-3 slots=2", 1, ErrBadNodeList, "unclosed '['"},
		{"unmatched bracket", "node1-3]", 1, ErrBadNodeList, "unmatched ']'"},
		{"nested bracket", "n[1[2]]", 1, ErrBadNodeList, "nested '['"},
		{"empty bracket", "node[]", 1, ErrBadNodeList, `empty brackets in "node[]"`},
		{"reversed range", "node[5-3]", 1, ErrBadNodeList, `reversed range 5-3 in "node[5-3]"`},
		{"letters in bracket", "node[a-c]", 1, ErrBadNodeList, `invalid character 'a' in range "a-c"`},
		{"open range", "node[1-]", 1, ErrBadNodeList, `missing number in range "1-"`},
		{"bracket expands to bad name", "n-[1-2]-", 1, ErrBadHostName, "starting or ending with '-'"},

		// Conflicts, reported at the later line and naming the earlier one.
		{"rack conflict", "a rack=r1\nb\na rack=r2\n", 3, ErrConflict, `host "a": rack=r2 conflicts with rack=r1 at t:1`},
		{"rack conflict names the line that set it", "a\na rack=r1\na rack=r2", 3, ErrConflict, "conflicts with rack=r1 at t:2"},
		{"switch conflict", "a switch=s1\na switch=s2", 2, ErrConflict, `host "a": switch=s2 conflicts with switch=s1 at t:1`},
		{"spare then not", "a spare\na", 2, ErrConflict, `host "a" is marked spare at t:1 but not here`},
		{"not spare then spare", "a\na spare", 2, ErrConflict, `host "a" is marked spare here but not at t:1`},
		{"max_slots then none", "a max_slots=4\na", 2, ErrConflict, `host "a" has max_slots at t:1 but not here`},
		{"none then max_slots", "a\na max_slots=4", 2, ErrConflict, `host "a" has max_slots here but not at t:1`},
		{"conflict through node list", "n2 rack=r1\nn[1-3] rack=r2", 2, ErrConflict, `host "n2": rack=r2 conflicts with rack=r1 at t:1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseHostfile(strings.NewReader(tt.in), "t")
			checkHostfileError(t, err, "t", tt.line, tt.kind, tt.msg)
		})
	}
}

// checkHostfileError checks that err is a *HostfileError for file:line
// wrapping kind, whose text holds msg.
func checkHostfileError(t *testing.T, err error, file string, line int, kind error, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want %v", kind)
	}
	var he *HostfileError
	if !errors.As(err, &he) {
		t.Fatalf("error %q (%T) is not a *HostfileError", err, err)
	}
	if he.File != file || he.Line != line {
		t.Errorf("error at %s:%d, want %s:%d (%v)", he.File, he.Line, file, line, err)
	}
	if !errors.Is(err, kind) {
		t.Errorf("error %q does not wrap %v", err, kind)
	}
	prefix := "hostfile " + file + ":" + itoa(line) + ": "
	if line == 0 {
		prefix = "hostfile " + file + ": "
	}
	if !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("error %q does not start with %q", err, prefix)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not contain %q", err, msg)
	}
}

func TestParseHostfileLimits(t *testing.T) {
	t.Run("line at the limit", func(t *testing.T) {
		line := "a" + strings.Repeat(" ", maxLineLen-len("aslots=2")) + "slots=2"
		if len(line) != maxLineLen {
			t.Fatalf("test line has %d bytes", len(line))
		}
		hosts, err := ParseHostfile(strings.NewReader("b\n"+line+"\r\n"), "t")
		if err != nil || len(hosts) != 2 || hosts[1].Slots != 2 {
			t.Fatalf("got %+v, %v", hosts, err)
		}
	})
	tooLong := []struct {
		name string
		in   string
	}{
		{"one byte over", "b\n" + strings.Repeat(" ", maxLineLen) + "a\n"},
		{"one byte over without newline", "b\n" + strings.Repeat(" ", maxLineLen) + "a"},
		{"far over", "b\n" + strings.Repeat("a", 10*maxLineLen)},
		{"comment over", "b\n#" + strings.Repeat("x", maxLineLen) + "\n"},
	}
	for _, tt := range tooLong {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseHostfile(strings.NewReader(tt.in), "t")
			checkHostfileError(t, err, "t", 2, ErrTooLarge, "line longer than 65536 bytes")
		})
	}
	t.Run("one line expands too far", func(t *testing.T) {
		_, err := ParseHostfile(strings.NewReader("n[1-1000001]"), "t")
		checkHostfileError(t, err, "t", 1, ErrTooLarge, "too many hosts: \"n[1-1000001]\" takes the count past the limit of 1000000")
	})
	t.Run("brackets multiply too far", func(t *testing.T) {
		_, err := ParseHostfile(strings.NewReader("r[1-1000]n[1-1000]x[1-2]"), "t")
		checkHostfileError(t, err, "t", 1, ErrTooLarge, "takes the count past the limit")
	})
	t.Run("lines add up too far", func(t *testing.T) {
		if testing.Short() {
			t.Skip("builds a million host names")
		}
		in := "n[1-600000]\nn[1-400000]\nx\n"
		_, err := ParseHostfile(strings.NewReader(in), "t")
		checkHostfileError(t, err, "t", 3, ErrTooLarge, `too many hosts: "x" takes the count past the limit of 1000000`)
	})
}

// errReader fails after returning its data.
type errReader struct {
	data string
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if r.data == "" {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestParseHostfileReadError(t *testing.T) {
	boom := errors.New("boom")
	_, err := ParseHostfile(&errReader{data: "a\nb\n", err: boom}, "t")
	checkHostfileError(t, err, "t", 0, boom, "read: boom")
}

func TestParseHostfileNoName(t *testing.T) {
	hosts, err := ParseHostfile(strings.NewReader("a"), "")
	if err != nil || hosts[0].Source != "<input>:1" {
		t.Fatalf("got %+v, %v; want Source <input>:1", hosts, err)
	}
	_, err = ParseHostfile(strings.NewReader("a b"), "")
	checkHostfileError(t, err, "<input>", 1, ErrSyntax, "unknown attribute")
}

func TestReadHostfile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "hosts")
	if err := os.WriteFile(good, []byte("a slots=2\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hosts, err := ReadHostfile(good)
	if err != nil {
		t.Fatal(err)
	}
	want := []Host{{Name: "a", Slots: 2, Source: good + ":1"}, {Name: "b", Slots: 1, Source: good + ":2"}}
	if !reflect.DeepEqual(hosts, want) {
		t.Errorf("got %+v, want %+v", hosts, want)
	}

	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("a\nb slots=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ReadHostfile(bad)
	checkHostfileError(t, err, bad, 2, ErrBadValue, `slots "x" is not a positive integer`)

	missing := filepath.Join(dir, "missing")
	_, err = ReadHostfile(missing)
	checkHostfileError(t, err, missing, 0, fs.ErrNotExist, "open: ")

	_, err = ReadHostfile(dir)
	var he *HostfileError
	if !errors.As(err, &he) || he.File != dir || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("ReadHostfile(dir) = %v; want a HostfileError naming %s saying it is a directory", err, dir)
	}
}

func TestHostfileErrorString(t *testing.T) {
	tests := []struct {
		err  HostfileError
		want string
	}{
		{HostfileError{File: "h", Line: 3, Msg: "bad"}, "hostfile h:3: bad"},
		{HostfileError{File: "h", Line: 0, Msg: "no hosts"}, "hostfile h: no hosts"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	inner := errors.New("inner")
	if !errors.Is(&HostfileError{Err: inner}, inner) {
		t.Error("HostfileError does not unwrap to Err")
	}
}

func TestParseHostList(t *testing.T) {
	h := func(name string, slots, entry int) Host {
		return Host{Name: name, Slots: slots, Source: "-H:" + itoa(entry)}
	}
	tests := []struct {
		in   string
		want []Host
	}{
		{"h1", []Host{h("h1", 1, 1)}},
		{"h1:2,h2,node[01-03]:4", []Host{h("h1", 2, 1), h("h2", 1, 2), h("node01", 4, 3), h("node02", 4, 3), h("node03", 4, 3)}},
		{"h1,h1", []Host{h("h1", 2, 1)}},
		{"h1:2,h2,h1:3", []Host{h("h1", 5, 1), h("h2", 1, 2)}},
		{" h1 , h2:2 ", []Host{h("h1", 1, 1), h("h2", 2, 2)}},
		{"[::1]:2,[fd00::2]", []Host{h("::1", 2, 1), h("fd00::2", 1, 2)}},
		{"r[1-2]n[1-2]:2", []Host{h("r1n1", 2, 1), h("r1n2", 2, 1), h("r2n1", 2, 1), h("r2n2", 2, 1)}},
		{"10.0.0.[1-2]", []Host{h("10.0.0.1", 1, 1), h("10.0.0.2", 1, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseHostList(tt.in)
			if err != nil {
				t.Fatalf("ParseHostList(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseHostList(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseHostListErrors(t *testing.T) {
	tests := []struct {
		in   string
		kind error
		msg  string
	}{
		{"", ErrNoHosts, "topology: no hosts: empty host list"},
		{"  ", ErrNoHosts, "empty host list"},
		{"a,,b", ErrBadNodeList, "empty entry at byte 3"},
		{"a, ,b", ErrSyntax, "host list entry 2: empty host entry"},
		{"a,", ErrBadNodeList, "empty entry at end"},
		{"a:0", ErrBadValue, `host list entry 1: slot count must be between 1 and 1048576, got "0"`},
		{"a,b:x", ErrBadValue, `host list entry 2: slot count "x" is not a positive integer`},
		{"a b", ErrBadHostName, `invalid character ' ' in host name "a b"`},
		{"a slots=2", ErrBadHostName, "invalid character ' '"},
		{"n[1-", ErrBadNodeList, "unclosed '['"},
		{"n[3-1]", ErrBadNodeList, "reversed range 3-1"},
		{"fd00::1", ErrBadHostName, "write IPv6 addresses in brackets"},
		{"[fd00::1]:2:3", ErrBadValue, `slot count "2:3" is not a positive integer`},
		{"n[1-1000001]", ErrTooLarge, "past the limit of 1000000"},
		{"a:1048576,a", ErrBadValue, "slots add up to more than 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseHostList(tt.in)
			if err == nil {
				t.Fatalf("ParseHostList(%q) succeeded; want %v", tt.in, tt.kind)
			}
			if !errors.Is(err, tt.kind) {
				t.Errorf("ParseHostList(%q) = %q; does not wrap %v", tt.in, err, tt.kind)
			}
			if !strings.HasPrefix(err.Error(), "topology: ") || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("ParseHostList(%q) = %q; want topology: ...%s...", tt.in, err, tt.msg)
			}
		})
	}
}

func BenchmarkParseHostfile(b *testing.B) {
	var sb strings.Builder
	for i := range 10000 {
		sb.WriteString("node" + itoa(i) + " slots=8 max_slots=16 rack=r" + itoa(i%40) + " switch=s" + itoa(i%4) + " # comment\n")
	}
	in := sb.String()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseHostfile(strings.NewReader(in), "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
