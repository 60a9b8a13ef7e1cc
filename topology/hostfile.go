package topology

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Host is one line-merged entry of a hostfile or -H list.
type Host struct {
	Name     string // host name (or address) as written; IPv6 without the brackets
	Slots    int    // >= 1
	MaxSlots int    // 0 = no hard limit; otherwise >= Slots
	Rack     string // from rack=..., "" if none
	Switch   string // from switch=..., "" if none
	Spare    bool   // gorun annotation `spare`: never given ranks at start
	Source   string // "file:line" where it was first defined, for messages ("-H:N" for entry N of a host list)
	// Addr is the address the host is reached at when it is known apart
	// from Name (Slurm's NodeAddr); "" = resolve Name.
	Addr string
}

// ReadHostfile reads and parses the hostfile at path. Errors opening or
// reading it are *HostfileError naming the file, wrapping the I/O error.
func ReadHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &HostfileError{File: path, Msg: ioMsg(err), Err: err}
	}
	defer f.Close()
	return ParseHostfile(f, path)
}

// ioMsg describes an I/O error without repeating the file name that a
// HostfileError already prints.
func ioMsg(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return "read: " + err.Error()
}

// ParseHostfile parses a hostfile (grammar in the package comment) read
// from r; file names it in errors and in each Host's Source ("<input>" if
// empty). Hosts are merged by name and returned in order of first
// appearance. Errors are *HostfileError wrapping a sentinel of this package
// or the read error.
func ParseHostfile(r io.Reader, file string) ([]Host, error) {
	if file == "" {
		file = "<input>"
	}
	m := newMerger()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineLen+2) // room for "\r\n"
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSuffix(sc.Text(), "\r")
		fail := func(err error) error {
			return &HostfileError{File: file, Line: lineNo, Msg: err.Error(), Err: errors.Unwrap(err)}
		}
		if len(line) > maxLineLen {
			return nil, fail(errorf(ErrTooLarge, "line longer than %d bytes", maxLineLen))
		}
		spec, err := parseLine(line, maxHosts-m.named)
		if err != nil {
			return nil, fail(err)
		}
		if spec == nil {
			continue
		}
		if err := m.add(spec, fmt.Sprintf("%s:%d", file, lineNo)); err != nil {
			return nil, fail(err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &HostfileError{File: file, Line: lineNo + 1,
				Msg: fmt.Sprintf("line longer than %d bytes", maxLineLen), Err: ErrTooLarge}
		}
		return nil, &HostfileError{File: file, Msg: ioMsg(err), Err: err}
	}
	if len(m.hosts) == 0 {
		return nil, &HostfileError{File: file, Msg: "no hosts", Err: ErrNoHosts}
	}
	return m.result(), nil
}

// ParseHostList parses an mpirun -H host list such as "h1:2,h2,node[01-03]:4":
// comma-separated entries, each a host name, an IPv6 address in brackets or
// a Slurm node list, with an optional ":N" giving the slots of every host
// it names (default 1). Spaces around entries are ignored. Repeated hosts
// are merged, adding their slots. The Source of a host is "-H:N" for the
// 1-based entry N that first named it.
func ParseHostList(s string) ([]Host, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: empty host list", ErrNoHosts)
	}
	entries, err := splitTopLevel(s)
	if err != nil {
		return nil, fmt.Errorf("topology: host list %s: %w", shorten(s), err)
	}
	m := newMerger()
	for i, e := range entries {
		e = strings.TrimSpace(e)
		spec, err := parseHostEntry(e, maxHosts-m.named)
		if err != nil {
			return nil, fmt.Errorf("topology: host list entry %d: %w", i+1, err)
		}
		line := &lineSpec{entries: []hostSpec{spec}}
		if err := m.add(line, fmt.Sprintf("-H:%d", i+1)); err != nil {
			return nil, fmt.Errorf("topology: host list entry %d: %w", i+1, err)
		}
	}
	return m.result(), nil
}

// hostSpec is one host list entry: the names it expands to and its ":N".
type hostSpec struct {
	names []string
	slots int // 0 if no ":N"
	text  string
}

// lineSpec is one parsed hostfile line.
type lineSpec struct {
	entries     []hostSpec
	slots       int // from slots=, 0 if not given
	maxSlots    int // from max_slots=, 0 if not given
	rack, swtch string
	spare       bool
}

// parseLine parses one hostfile line; it returns nil for a blank or
// comment-only line. budget is how many more hosts may be named.
func parseLine(line string, budget int) (*lineSpec, error) {
	if i := strings.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return nil, nil
	}
	if strings.ContainsRune(fields[0], '=') {
		return nil, errorf(ErrSyntax, "line starts with %s; the host name must come first", shorten(fields[0]))
	}
	spec := &lineSpec{}
	seen := map[string]bool{}
	for _, f := range fields[1:] {
		key, val, hasVal := strings.Cut(f, "=")
		switch key {
		case "":
			return nil, errorf(ErrSyntax, "missing key before '=' in %s", shorten(f))
		case "slots", "max_slots", "rack", "switch":
			if !hasVal {
				return nil, errorf(ErrSyntax, "%s needs a value, e.g. %s=4", key, key)
			}
		case "spare":
			if hasVal {
				return nil, errorf(ErrSyntax, "spare takes no value (got %s)", shorten(f))
			}
		default:
			switch {
			case hasVal:
				return nil, errorf(ErrSyntax, "unknown key %s", shorten(key))
			case strings.ContainsRune(f, ':'):
				return nil, errorf(ErrSyntax, "unknown attribute %s; attributes are written key=value, e.g. slots=4", shorten(f))
			default:
				return nil, errorf(ErrSyntax, "unknown attribute %s", shorten(f))
			}
		}
		if seen[key] {
			return nil, errorf(ErrSyntax, "duplicate key %q", key)
		}
		seen[key] = true
		if hasVal && val == "" {
			return nil, errorf(ErrSyntax, "empty value for %q", key)
		}
		var err error
		switch key {
		case "slots":
			spec.slots, err = parseCount("slots", val)
		case "max_slots":
			spec.maxSlots, err = parseCount("max_slots", val)
		case "rack":
			spec.rack, err = parseLabel("rack", val)
		case "switch":
			spec.swtch, err = parseLabel("switch", val)
		case "spare":
			spec.spare = true
		}
		if err != nil {
			return nil, err
		}
	}

	entries, err := splitTopLevel(fields[0])
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		hs, err := parseHostEntry(e, budget)
		if err != nil {
			return nil, err
		}
		budget -= len(hs.names)
		if hs.slots > 0 && spec.slots > 0 {
			return nil, errorf(ErrSyntax, "slots given twice: %s and slots=%d", shorten(hs.text), spec.slots)
		}
		if eff := max(hs.slots, spec.slots, 1); spec.maxSlots > 0 && spec.maxSlots < eff {
			return nil, errorf(ErrBadValue, "max_slots=%d is less than slots %d", spec.maxSlots, eff)
		}
		spec.entries = append(spec.entries, hs)
	}
	return spec, nil
}

// parseHostEntry parses one entry of a host list: "name", "name:N",
// "node[01-04]:N", "[fd00::1]" or "[fd00::1]:N". budget is how many more
// hosts it may name.
func parseHostEntry(e string, budget int) (hostSpec, error) {
	hs := hostSpec{text: e}
	if e == "" {
		return hs, errorf(ErrSyntax, "empty host entry")
	}
	namePart, countPart, hasCount := e, "", false
	if e[0] == '[' {
		if end := strings.IndexByte(e, ']'); end > 0 && strings.ContainsRune(e[1:end], ':') {
			// A bracketed IPv6 address.
			if budget < 1 {
				return hs, tooMany(e)
			}
			addr, rest := e[1:end], e[end+1:]
			a, err := netip.ParseAddr(addr)
			if err != nil || !a.Is6() {
				return hs, errorf(ErrBadHostName, "invalid IPv6 address %s", shorten(addr))
			}
			if rest != "" {
				if rest[0] != ':' {
					return hs, errorf(ErrSyntax, "unexpected %s after IPv6 address [%s]", shorten(rest), addr)
				}
				n, err := parseCount("slot count", rest[1:])
				if err != nil {
					return hs, err
				}
				hs.slots = n
			}
			hs.names = []string{addr}
			return hs, nil
		}
	}
	if i := indexOutsideBrackets(e, ':'); i >= 0 {
		namePart, countPart, hasCount = e[:i], e[i+1:], true
	}
	if hasCount {
		if strings.ContainsRune(countPart, ':') {
			return hs, errorf(ErrBadHostName, "too many ':' in %s; write IPv6 addresses in brackets, e.g. [fd00::1]:4", shorten(e))
		}
		if namePart == "" {
			return hs, errorf(ErrBadHostName, "missing host name before ':' in %s", shorten(e))
		}
		n, err := parseCount("slot count", countPart)
		if err != nil {
			return hs, err
		}
		hs.slots = n
	}
	names, err := expandPattern(namePart, budget)
	if err != nil {
		return hs, err
	}
	hs.names = names
	return hs, nil
}

// indexOutsideBrackets returns the index of the first c in s that is not
// inside [...], or -1.
func indexOutsideBrackets(s string, c byte) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case c:
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// parseCount parses a slot count: decimal digits, 1 to maxSlots.
func parseCount(what, s string) (int, error) {
	if s == "" {
		return 0, errorf(ErrSyntax, "empty %s", what)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errorf(ErrBadValue, "%s %s is not a positive integer", what, shorten(s))
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxSlots {
		return 0, errorf(ErrBadValue, "%s must be between 1 and %d, got %s", what, maxSlots, shorten(s))
	}
	return n, nil
}

// parseLabel checks a rack or switch label.
func parseLabel(what, s string) (string, error) {
	if len(s) > maxAttrLen {
		return "", errorf(ErrBadValue, "%s label %s is longer than %d bytes", what, shorten(s), maxAttrLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isNameByte(c) && c != ':' && c != '/' {
			return "", errorf(ErrBadValue, "invalid character %q in %s label %s", c, what, shorten(s))
		}
	}
	return s, nil
}

// merger merges host definitions by name, keeping first-appearance order.
type merger struct {
	hosts []mergedHost
	index map[string]int
	named int // host names seen, counting repeats
}

type mergedHost struct {
	Host
	rackSrc, switchSrc string
}

func newMerger() *merger { return &merger{index: map[string]int{}} }

// add merges the hosts of one line (or host list entry) defined at src.
func (m *merger) add(l *lineSpec, src string) error {
	n := 0
	for _, e := range l.entries {
		n += len(e.names)
	}
	m.hosts = slices.Grow(m.hosts, n)
	for _, e := range l.entries {
		slots := max(e.slots, l.slots, 1)
		for _, name := range e.names {
			m.named++
			i, ok := m.index[name]
			if !ok {
				m.index[name] = len(m.hosts)
				h := mergedHost{Host: Host{Name: name, Slots: slots, MaxSlots: l.maxSlots,
					Rack: l.rack, Switch: l.swtch, Spare: l.spare, Source: src}}
				if l.rack != "" {
					h.rackSrc = src
				}
				if l.swtch != "" {
					h.switchSrc = src
				}
				m.hosts = append(m.hosts, h)
				continue
			}
			if err := m.hosts[i].merge(slots, l, src); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h *mergedHost) merge(slots int, l *lineSpec, src string) error {
	if l.spare != h.Spare {
		if h.Spare {
			return errorf(ErrConflict, "host %q is marked spare at %s but not here", h.Name, h.Source)
		}
		return errorf(ErrConflict, "host %q is marked spare here but not at %s", h.Name, h.Source)
	}
	if (l.maxSlots > 0) != (h.MaxSlots > 0) {
		if h.MaxSlots > 0 {
			return errorf(ErrConflict, "host %q has max_slots at %s but not here; give it on every line or none", h.Name, h.Source)
		}
		return errorf(ErrConflict, "host %q has max_slots here but not at %s; give it on every line or none", h.Name, h.Source)
	}
	if l.rack != "" {
		if h.Rack != "" && h.Rack != l.rack {
			return errorf(ErrConflict, "host %q: rack=%s conflicts with rack=%s at %s", h.Name, l.rack, h.Rack, h.rackSrc)
		}
		if h.Rack == "" {
			h.Rack, h.rackSrc = l.rack, src
		}
	}
	if l.swtch != "" {
		if h.Switch != "" && h.Switch != l.swtch {
			return errorf(ErrConflict, "host %q: switch=%s conflicts with switch=%s at %s", h.Name, l.swtch, h.Switch, h.switchSrc)
		}
		if h.Switch == "" {
			h.Switch, h.switchSrc = l.swtch, src
		}
	}
	if h.Slots+slots > maxSlots || h.MaxSlots+l.maxSlots > maxSlots {
		return errorf(ErrBadValue, "host %q: slots add up to more than %d (first defined at %s)", h.Name, maxSlots, h.Source)
	}
	h.Slots += slots
	if l.maxSlots > 0 {
		h.MaxSlots += l.maxSlots
	}
	return nil
}

func (m *merger) result() []Host {
	out := make([]Host, len(m.hosts))
	for i, h := range m.hosts {
		out[i] = h.Host
	}
	return out
}
