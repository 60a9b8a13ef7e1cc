package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape GETs url and parses the exposition with parseExposition, which
// fails the test on anything that is not the text format.
func scrape(t *testing.T, url string) map[string]*metricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, res.Status, err)
	}
	if ct := res.Header.Get("Content-Type"); ct != expositionType {
		t.Errorf("Content-Type %q, want %q", ct, expositionType)
	}
	fams, err := parseExposition(string(b))
	if err != nil {
		t.Fatalf("parsing the exposition: %v\n%s", err, b)
	}
	return fams
}

// metricFamily is a family as parseExposition read it.
type metricFamily struct {
	name, help, typ string
	samples         []expoSample
}

// expoSample is one sample line.
type expoSample struct {
	name   string
	labels map[string]string
	value  float64
}

// series is the number of series: samples, or for a histogram its
// label sets (each has its buckets, _sum and _count).
func (f *metricFamily) series() int {
	n := 0
	for _, s := range f.samples {
		if f.typ != "histogram" || strings.HasSuffix(s.name, "_count") {
			n++
		}
	}
	return n
}

// histogramSum is the value of the _sum of f's first series.
func (f *metricFamily) histogramSum() float64 {
	for _, s := range f.samples {
		if s.name == f.name+"_sum" {
			return s.value
		}
	}
	return math.NaN()
}

var metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// parseExposition parses the Prometheus text format (0.0.4) strictly:
// each family once, in name order, its # HELP (escapes \\ and \n only)
// then its # TYPE (counter, gauge or histogram) before its samples; every
// sample of the current family (a histogram's as name_bucket, _sum and
// _count), with well-formed, unique labels and a float value, no series
// twice; a counter never negative; a histogram's buckets, per label set,
// with le ascending to a last +Inf, cumulative counts that never fall,
// then one _sum and one _count equal to the +Inf bucket's. The text ends
// with a newline and has no blank lines.
func parseExposition(text string) (map[string]*metricFamily, error) {
	if text == "" || !strings.HasSuffix(text, "\n") {
		return nil, errors.New("empty, or no final newline")
	}
	fams := map[string]*metricFamily{}
	var cur *metricFamily
	var last string // the previous family's name
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		fail := func(format string, a ...any) error {
			return fmt.Errorf("line %d %q: %s", i+1, line, fmt.Sprintf(format, a...))
		}
		switch {
		case line == "":
			return nil, fail("blank line")
		case strings.HasPrefix(line, "# HELP "):
			name, help, ok := strings.Cut(strings.TrimPrefix(line, "# HELP "), " ")
			if !ok || !metricName.MatchString(name) {
				return nil, fail("bad HELP")
			}
			if fams[name] != nil {
				return nil, fail("family %s twice", name)
			}
			if name <= last {
				return nil, fail("family %s after %s: not in name order", name, last)
			}
			if cur != nil {
				if err := checkFamily(cur); err != nil {
					return nil, err
				}
			}
			h, err := unescape(help, false)
			if err != nil {
				return nil, fail("%v", err)
			}
			cur = &metricFamily{name: name, help: h}
			fams[name], last = cur, name
		case strings.HasPrefix(line, "# TYPE "):
			name, typ, _ := strings.Cut(strings.TrimPrefix(line, "# TYPE "), " ")
			switch {
			case cur == nil || name != cur.name:
				return nil, fail("TYPE without its HELP")
			case cur.typ != "" || len(cur.samples) > 0:
				return nil, fail("TYPE twice, or after samples")
			case typ != "counter" && typ != "gauge" && typ != "histogram":
				return nil, fail("type %q", typ)
			}
			cur.typ = typ
		case strings.HasPrefix(line, "#"):
			return nil, fail("a comment gorun does not write")
		default:
			s, err := parseSample(line)
			if err != nil {
				return nil, fail("%v", err)
			}
			if cur == nil || cur.typ == "" {
				return nil, fail("sample before its family's HELP and TYPE")
			}
			if s.name != cur.name && (cur.typ != "histogram" || s.name != cur.name+"_bucket" && s.name != cur.name+"_sum" && s.name != cur.name+"_count") {
				return nil, fail("sample of another family than %s", cur.name)
			}
			if k := s.name + fmt.Sprint(s.labels); seen[k] {
				return nil, fail("series twice")
			} else {
				seen[k] = true
			}
			if cur.typ == "counter" && !(s.value >= 0) {
				return nil, fail("counter %v", s.value)
			}
			cur.samples = append(cur.samples, s)
		}
	}
	if cur == nil {
		return nil, errors.New("no family")
	}
	return fams, checkFamily(cur)
}

// checkFamily checks that f has samples and, for a histogram, its buckets,
// _sum and _count.
func checkFamily(f *metricFamily) error {
	if f.typ == "" || len(f.samples) == 0 {
		return fmt.Errorf("family %s: no TYPE or no samples", f.name)
	}
	if f.typ != "histogram" {
		return nil
	}
	type state struct {
		le, count  float64
		inf        bool
		sum, total int
	}
	byLabels := map[string]*state{}
	for _, s := range f.samples {
		ls := maps.Clone(s.labels)
		le, hasLE := ls["le"]
		delete(ls, "le")
		k := fmt.Sprint(ls)
		st := byLabels[k]
		if st == nil {
			st = &state{le: math.Inf(-1)}
			byLabels[k] = st
		}
		switch s.name {
		case f.name + "_bucket":
			v, err := strconv.ParseFloat(le, 64)
			switch {
			case !hasLE || err != nil:
				return fmt.Errorf("%s: bucket with le %q", f.name, le)
			case st.inf || st.sum+st.total > 0:
				return fmt.Errorf("%s: bucket le=%s after +Inf, _sum or _count", f.name, le)
			case v <= st.le:
				return fmt.Errorf("%s: le=%s after le=%v: not ascending", f.name, le, st.le)
			case s.value < st.count || s.value != math.Trunc(s.value):
				return fmt.Errorf("%s: bucket le=%s count %v after %v: not cumulative counts", f.name, le, s.value, st.count)
			}
			st.le, st.count, st.inf = v, s.value, math.IsInf(v, 1)
		case f.name + "_sum":
			if hasLE || !st.inf || st.sum > 0 {
				return fmt.Errorf("%s: _sum before the +Inf bucket, twice, or with le", f.name)
			}
			st.sum++
		case f.name + "_count":
			if hasLE || !st.inf || st.total > 0 || s.value != st.count {
				return fmt.Errorf("%s: _count %v before the +Inf bucket, twice, with le, or not the +Inf bucket's %v", f.name, s.value, st.count)
			}
			st.total++
		default:
			return fmt.Errorf("%s: histogram sample %s", f.name, s.name)
		}
	}
	for k, st := range byLabels {
		if !st.inf || st.sum != 1 || st.total != 1 {
			return fmt.Errorf("%s%s: no +Inf bucket, _sum or _count", f.name, k)
		}
	}
	return nil
}

// parseSample parses name{label="value",...} value.
func parseSample(line string) (expoSample, error) {
	s := expoSample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, errors.New("no value")
	}
	s.name, line = line[:i], line[i:]
	if !metricName.MatchString(s.name) {
		return s, errors.New("bad metric name")
	}
	if line[0] == '{' {
		line = line[1:]
		for {
			eq := strings.Index(line, `="`)
			if eq < 0 {
				return s, errors.New("bad label")
			}
			name := line[:eq]
			if !regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`).MatchString(name) {
				return s, fmt.Errorf("bad label name %q", name)
			}
			if _, dup := s.labels[name]; dup {
				return s, fmt.Errorf("label %s twice", name)
			}
			line = line[eq+2:]
			end := -1 // the closing quote
			for j := 0; j < len(line); j++ {
				if line[j] == '\\' {
					j++
				} else if line[j] == '"' {
					end = j
					break
				}
			}
			if end < 0 {
				return s, errors.New("unterminated label value")
			}
			v, err := unescape(line[:end], true)
			if err != nil {
				return s, err
			}
			s.labels[name], line = v, line[end+1:]
			if strings.HasPrefix(line, ",") {
				line = line[1:]
				continue
			}
			if !strings.HasPrefix(line, "}") {
				return s, errors.New("labels not closed")
			}
			line = line[1:]
			break
		}
	}
	v, ok := strings.CutPrefix(line, " ")
	if !ok || strings.Contains(v, " ") {
		return s, errors.New("want one space, then the value (gorun writes no timestamp)")
	}
	var err error
	if s.value, err = strconv.ParseFloat(v, 64); err != nil {
		return s, fmt.Errorf("value: %w", err)
	}
	return s, nil
}

// unescape undoes the format's escapes: \\ and \n, and in a label
// value also \".
func unescape(s string, label bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\n' || label && c == '"' {
			return "", fmt.Errorf("unescaped %q in %q", c, s)
		}
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		if i++; i == len(s) {
			return "", fmt.Errorf("a trailing backslash in %q", s)
		}
		switch s[i] {
		case '\\':
			b.WriteByte('\\')
		case 'n':
			b.WriteByte('\n')
		case '"':
			if !label {
				return "", fmt.Errorf(`\" in help %q`, s)
			}
			b.WriteByte('"')
		default:
			return "", fmt.Errorf("bad escape \\%c in %q", s[i], s)
		}
	}
	return b.String(), nil
}

// value is the value of family name's series with labels (name=value
// pairs); for a histogram, its _count. NaN if there is none.
func value(fams map[string]*metricFamily, name string, labels ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return math.NaN()
	}
next:
	for _, s := range f.samples {
		if f.typ == "histogram" && s.name != name+"_count" || f.typ != "histogram" && s.name != name {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if v, ok := s.labels[labels[i]]; !ok || v != labels[i+1] {
				continue next
			}
		}
		return s.value
	}
	return math.NaN()
}

// failureCounts is gorun_failures_total's series that are not 0, as
// "class/decision" → count.
func failureCounts(fams map[string]*metricFamily) map[string]float64 {
	out := map[string]float64{}
	if f := fams["gorun_failures_total"]; f != nil {
		for _, s := range f.samples {
			if s.value != 0 {
				out[s.labels["class"]+"/"+s.labels["decision"]] = s.value
			}
		}
	}
	return out
}

// TestExpositionText: the exact text of a set: families by name, HELP
// and label values escaped, series by label values, a histogram's
// buckets cumulative (an observation on a bound counts in its bucket)
// with _sum and _count.
func TestExpositionText(t *testing.T) {
	s := &metricSet{}
	s.gauge("b_gauge", `a \ and a
newline`).Set(-1.5)
	v := s.counterVec("c_total", "A vec.", "k", "l")
	v.with("y", `q"\`).Add(2)
	v.with("x", "z").Inc()
	h := s.histogram("a_seconds", "H.", []float64{0.5, 1, 2.5})
	for _, o := range []float64{0.5, 0.7, 3, 1} {
		h.Observe(o)
	}
	s.counter("d_total", "D.").Add(1e21)
	want := `# HELP a_seconds H.
# TYPE a_seconds histogram
a_seconds_bucket{le="0.5"} 1
a_seconds_bucket{le="1"} 3
a_seconds_bucket{le="2.5"} 3
a_seconds_bucket{le="+Inf"} 4
a_seconds_sum 5.2
a_seconds_count 4
# HELP b_gauge a \\ and a\nnewline
# TYPE b_gauge gauge
b_gauge -1.5
# HELP c_total A vec.
# TYPE c_total counter
c_total{k="x",l="z"} 1
c_total{k="y",l="q\"\\"} 2
# HELP d_total D.
# TYPE d_total counter
d_total 1e+21
`
	got := string(s.appendExposition(nil))
	if got != want {
		t.Errorf("exposition:\n%s\nwant:\n%s", got, want)
	}
	fams, err := parseExposition(got)
	if err != nil {
		t.Fatal(err)
	}
	if h := fams["b_gauge"].help; h != "a \\ and a\nnewline" {
		t.Errorf("help read back %q", h)
	}
	if v := value(fams, "c_total", "l", `q"\`); v != 2 {
		t.Errorf("c_total{l=q\"\\} read back %v", v)
	}
}

// TestParseExpositionRejects: the checker behind every scrape refuses
// what is not the format, or not what gorun writes.
func TestParseExpositionRejects(t *testing.T) {
	const ok = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n"
	hist := func(lines ...string) string {
		return "# HELP h H.\n# TYPE h histogram\n" + strings.Join(lines, "\n") + "\n"
	}
	if _, err := parseExposition(ok); err != nil {
		t.Fatalf("a good exposition refused: %v", err)
	}
	if _, err := parseExposition(hist(`h_bucket{le="1"} 1`, `h_bucket{le="+Inf"} 2`, "h_sum 3", "h_count 2")); err != nil {
		t.Fatalf("a good histogram refused: %v", err)
	}
	for _, tt := range []struct{ name, text string }{
		{"empty", ""},
		{"no final newline", strings.TrimSuffix(ok, "\n")},
		{"blank line", ok + "\n"},
		{"no HELP", "# TYPE a_total counter\na_total 1\n"},
		{"no TYPE", "# HELP a_total A.\na_total 1\n"},
		{"unknown type", "# HELP a A.\n# TYPE a summary\na 1\n"},
		{"family twice", ok + ok},
		{"families out of order", "# HELP b B.\n# TYPE b gauge\nb 1\n" + ok},
		{"no samples", "# HELP a_total A.\n# TYPE a_total counter\n" + "# HELP b B.\n# TYPE b gauge\nb 1\n"},
		{"sample of another family", "# HELP a_total A.\n# TYPE a_total counter\nb_total 1\n"},
		{"series twice", ok + "a_total 2\n"},
		{"negative counter", "# HELP a_total A.\n# TYPE a_total counter\na_total -1\n"},
		{"bad value", "# HELP a_total A.\n# TYPE a_total counter\na_total one\n"},
		{"timestamp", "# HELP a_total A.\n# TYPE a_total counter\na_total 1 1700000000\n"},
		{"bad escape in help", "# HELP a_total A\\t.\n# TYPE a_total counter\na_total 1\n"},
		{"label not closed", "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"v\" 1\n"},
		{"unquoted label", "# HELP a_total A.\n# TYPE a_total counter\na_total{k=v} 1\n"},
		{"label twice", "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"v\",k=\"w\"} 1\n"},
		{"no +Inf bucket", hist(`h_bucket{le="1"} 1`, "h_sum 1", "h_count 1")},
		{"buckets not cumulative", hist(`h_bucket{le="1"} 2`, `h_bucket{le="+Inf"} 1`, "h_sum 1", "h_count 1")},
		{"le descending", hist(`h_bucket{le="2"} 1`, `h_bucket{le="1"} 1`, `h_bucket{le="+Inf"} 1`, "h_sum 1", "h_count 1")},
		{"count not +Inf's", hist(`h_bucket{le="+Inf"} 2`, "h_sum 1", "h_count 3")},
		{"no _sum", hist(`h_bucket{le="+Inf"} 2`, "h_count 2")},
		{"no _count", hist(`h_bucket{le="+Inf"} 2`, "h_sum 1")},
		{"bucket without le", hist(`h_bucket 2`, "h_sum 1", "h_count 2")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseExposition(tt.text); err == nil {
				t.Errorf("accepted:\n%s", tt.text)
			}
		})
	}
}
