package topology

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Limits that keep hostile input from exhausting memory or time.
const (
	maxLineLen  = 64 << 10 // bytes in one hostfile line
	maxSlots    = 1 << 20  // slots (and max_slots) of one host
	maxRanks    = 1 << 24  // ranks MapRanks will place
	maxNameLen  = 253      // bytes in a host name
	maxLabelLen = 63       // bytes in one dot-separated label of a host name
	maxAttrLen  = 255      // bytes in a rack or switch label
	maxDigits   = 18       // digits in one bracket number (fits in uint64)
)

// maxHosts limits the hosts named by one hostfile, host list or node list
// (counting repeats). It is a variable only so that fuzz tests can lower it
// and spend their time on the grammar rather than on huge expansions.
var maxHosts = 1_000_000

// ExpandNodeList expands a Slurm node list such as
// "node[01-04,07],gpu[1-2]x,login" into host names, in order, keeping the
// zero padding of the written lower bound and keeping duplicates. Every
// resulting name must be a valid host name (see the package comment). An
// empty list, a malformed bracket (unclosed, nested, empty, reversed range,
// non-digits) and lists of more than 1,000,000 names are errors.
func ExpandNodeList(s string) ([]string, error) {
	if s == "" {
		return nil, fmt.Errorf("topology: node list: %w", errorf(ErrBadNodeList, "empty node list"))
	}
	items, err := splitTopLevel(s)
	if err != nil {
		return nil, fmt.Errorf("topology: node list %s: %w", shorten(s), err)
	}
	var out []string
	for _, item := range items {
		names, err := expandPattern(item, maxHosts-len(out))
		if err != nil {
			return nil, fmt.Errorf("topology: node list: %w", err)
		}
		out = append(out, names...)
	}
	return out, nil
}

// splitTopLevel splits s at commas outside brackets. It rejects empty
// items, nested or unmatched brackets.
func splitTopLevel(s string) ([]string, error) {
	var items []string
	start, open := 0, -1
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			if open >= 0 {
				return nil, errorf(ErrBadNodeList, "nested '[' at byte %d", i+1)
			}
			open = i
		case ']':
			if open < 0 {
				return nil, errorf(ErrBadNodeList, "unmatched ']' at byte %d", i+1)
			}
			open = -1
		case ',':
			if open >= 0 {
				continue
			}
			if i == start {
				return nil, errorf(ErrBadNodeList, "empty entry at byte %d", i+1)
			}
			items = append(items, s[start:i])
			start = i + 1
		}
	}
	if open >= 0 {
		return nil, errorf(ErrBadNodeList, "unclosed '[' at byte %d", open+1)
	}
	if start == len(s) {
		return nil, errorf(ErrBadNodeList, "empty entry at end")
	}
	return append(items, s[start:]), nil
}

// numRange is one lo-hi range of a bracket, printed zero-padded to width.
type numRange struct {
	lo, hi uint64
	width  int
}

// expandPattern expands one node list item (no top-level commas), such as
// "r[1-2]n[01-04,07]x", into at most budget host names, each validated.
func expandPattern(item string, budget int) ([]string, error) {
	// Split into literal parts and bracket groups: lits[0] g[0] lits[1] ...
	var lits []string
	var groups [][]numRange
	count := 1
	rest := item
	for {
		i := strings.IndexByte(rest, '[')
		if i < 0 {
			if strings.IndexByte(rest, ']') >= 0 {
				return nil, errorf(ErrBadNodeList, "unmatched ']' in %s", shorten(item))
			}
			lits = append(lits, rest)
			break
		}
		lits = append(lits, rest[:i])
		j := strings.IndexByte(rest[i:], ']')
		if j < 0 {
			return nil, errorf(ErrBadNodeList, "unclosed '[' in %s", shorten(item))
		}
		body := rest[i+1 : i+j]
		g, n, err := parseBracket(body, item)
		if err != nil {
			return nil, err
		}
		if n > budget/count {
			return nil, tooMany(item)
		}
		count *= n
		groups = append(groups, g)
		rest = rest[i+j+1:]
	}
	for _, lit := range lits {
		for k := 0; k < len(lit); k++ {
			if !isNameByte(lit[k]) {
				return nil, errorf(ErrBadHostName, "invalid character %q in host name %s", lit[k], shorten(item))
			}
		}
	}
	if count > budget {
		return nil, tooMany(item)
	}
	if len(groups) == 0 {
		if err := checkHostName(item); err != nil {
			return nil, err
		}
		return []string{item}, nil
	}

	// Format every group's values once, then walk the cartesian product
	// with the leftmost group varying slowest.
	vals := make([][]string, len(groups))
	for gi, g := range groups {
		for _, r := range g {
			for v := r.lo; ; v++ {
				vals[gi] = append(vals[gi], pad(v, r.width))
				if v == r.hi {
					break
				}
			}
		}
	}
	out := make([]string, 0, count)
	idx := make([]int, len(groups))
	var b strings.Builder
	for {
		b.Reset()
		for gi := range groups {
			b.WriteString(lits[gi])
			b.WriteString(vals[gi][idx[gi]])
		}
		b.WriteString(lits[len(groups)])
		name := b.String()
		if err := checkHostName(name); err != nil {
			return nil, err
		}
		out = append(out, name)
		gi := len(groups) - 1
		for ; gi >= 0; gi-- {
			idx[gi]++
			if idx[gi] < len(vals[gi]) {
				break
			}
			idx[gi] = 0
		}
		if gi < 0 {
			return out, nil
		}
	}
}

// parseBracket parses the inside of one bracket, "01-04,07", and returns
// its ranges and how many numbers they hold (at most maxHosts).
func parseBracket(body, item string) ([]numRange, int, error) {
	if body == "" {
		return nil, 0, errorf(ErrBadNodeList, "empty brackets in %s", shorten(item))
	}
	var rs []numRange
	n := 0
	for part := range strings.SplitSeq(body, ",") {
		if part == "" {
			return nil, 0, errorf(ErrBadNodeList, "empty range in [%s] of %s", body, shorten(item))
		}
		loS, hiS, isRange := strings.Cut(part, "-")
		lo, err := parseBracketNum(loS, part, item)
		if err != nil {
			return nil, 0, err
		}
		hi := lo
		if isRange {
			if hi, err = parseBracketNum(hiS, part, item); err != nil {
				return nil, 0, err
			}
			if hi < lo {
				return nil, 0, errorf(ErrBadNodeList, "reversed range %s in %s", part, shorten(item))
			}
		}
		if hi-lo >= uint64(maxHosts-n) {
			return nil, 0, tooMany(item)
		}
		n += int(hi-lo) + 1
		rs = append(rs, numRange{lo: lo, hi: hi, width: len(loS)})
	}
	return rs, n, nil
}

func parseBracketNum(s, part, item string) (uint64, error) {
	if s == "" {
		return 0, errorf(ErrBadNodeList, "missing number in range %q of %s", part, shorten(item))
	}
	if len(s) > maxDigits {
		return 0, errorf(ErrBadNodeList, "number %s in %s has more than %d digits", shorten(s), shorten(item), maxDigits)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errorf(ErrBadNodeList, "invalid character %q in range %q of %s (want digits, '-' and ',')", s[i], part, shorten(item))
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil { // cannot happen for at most maxDigits digits
		return 0, errorf(ErrBadNodeList, "bad number %q in %s", s, shorten(item))
	}
	return v, nil
}

// tooMany reports that item would name more hosts than allowed.
func tooMany(item string) error {
	return errorf(ErrTooLarge, "too many hosts: %s takes the count past the limit of %d", shorten(item), maxHosts)
}

// pad formats v in decimal with leading zeros up to width digits.
func pad(v uint64, width int) string {
	s := strconv.FormatUint(v, 10)
	if len(s) >= width {
		return s
	}
	return strings.Repeat("0", width-len(s)) + s
}

func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
}

// checkHostName reports whether name is a valid host name or IPv4 address
// (see the package comment).
func checkHostName(name string) error {
	if name == "" {
		return errorf(ErrBadHostName, "empty host name")
	}
	if len(name) > maxNameLen {
		return errorf(ErrBadHostName, "host name %s is longer than %d bytes", shorten(name), maxNameLen)
	}
	numeric := true
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return errorf(ErrBadHostName, "host name %q has an empty label (leading, trailing or doubled '.')", name)
		}
		if len(label) > maxLabelLen {
			return errorf(ErrBadHostName, "host name %q has a label longer than %d bytes", name, maxLabelLen)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !isNameByte(c) {
				return errorf(ErrBadHostName, "invalid character %q in host name %q", c, name)
			}
			if c < '0' || c > '9' {
				numeric = false
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return errorf(ErrBadHostName, "host name %q has a label starting or ending with '-'", name)
		}
	}
	if numeric {
		if a, err := netip.ParseAddr(name); err != nil || !a.Is4() {
			return errorf(ErrBadHostName, "host name %q is all digits but not a valid IPv4 address", name)
		}
	}
	return nil
}
