package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
)

// The page in a real browser: Debian's chromium, headless. Without it the
// tests skip, unless GORUN_REQUIRE_CHROMIUM=1 (CI) makes that a failure.

const windowW, windowH = 1280, 1100

func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("GORUN_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium not found, and GORUN_REQUIRE_CHROMIUM=1")
	}
	t.Skip("chromium not found (apt-get install chromium); set GORUN_REQUIRE_CHROMIUM=1 to fail instead")
	return ""
}

// browse loads page (a file) in headless chromium with mode's flag
// (--dump-dom, --screenshot=FILE) and returns its stdout and stderr.
// Everything chromium writes stays under t.TempDir(); its whole process
// group is killed when it is done, or after a minute.
func browse(t *testing.T, page string, mode string) (stdout, stderr string) {
	t.Helper()
	bin := chromiumPath(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--force-device-scale-factor=1", "--hide-scrollbars",
		fmt.Sprintf("--window-size=%d,%d", windowW, windowH), "--enable-logging=stderr", "--v=0", mode, "file://"+page)
	cmd.Env = append(os.Environ(), "HOME="+dir, "TMPDIR="+dir, "XDG_CONFIG_HOME="+dir, "XDG_CACHE_HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.Process != nil {
		// Its helpers (zygote, GPU, network processes) go with it.
		if kerr := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
			t.Errorf("killing chromium's process group: %v", kerr)
		}
	}
	if err != nil {
		t.Fatalf("chromium %s: %v\nstderr:\n%s", mode, err, errb.String())
	}
	return out.String(), errb.String()
}

// loaded is what the page's own script recorded, read back from the
// DOM: the errors it caught, and the marker boxes.
type loaded struct {
	errors  []string
	console []string // chromium's console lines that are errors
	markers map[string]image.Rectangle
}

var (
	preRE     = regexp.MustCompile(`(?s)<pre id="(console-errors|marker-boxes)">(.*?)</pre>`)
	consoleRE = regexp.MustCompile(`(?m)^.*:CONSOLE[^\]]*\] "(.*)".*$`)
)

func load(t *testing.T, page string) loaded {
	t.Helper()
	dom, stderr := browse(t, page, "--dump-dom")
	if !strings.Contains(dom, `data-loaded="1"`) {
		t.Fatalf("the page's script did not run to its end (no data-loaded):\n%.2000s\nstderr:\n%s", dom, stderr)
	}
	l := loaded{markers: map[string]image.Rectangle{}}
	for _, m := range preRE.FindAllStringSubmatch(dom, -1) {
		body := strings.TrimSpace(m[2])
		if body == "" {
			continue
		}
		for _, line := range strings.Split(body, "\n") {
			if m[1] == "console-errors" {
				l.errors = append(l.errors, line)
				continue
			}
			f := strings.Fields(line)
			if len(f) != 5 {
				t.Fatalf("marker box %q", line)
			}
			var v [4]int
			for i := range v {
				v[i], _ = strconv.Atoi(f[i+1])
			}
			l.markers[f[0]] = image.Rect(v[0], v[1], v[0]+v[2], v[1]+v[3])
		}
	}
	for _, m := range consoleRE.FindAllStringSubmatch(stderr, -1) {
		if strings.Contains(m[1], "Uncaught") || strings.Contains(strings.ToLower(m[1]), "error") {
			l.console = append(l.console, m[1])
		}
	}
	return l
}

func writePage(t *testing.T, recs []events.Record, edit func(string) string) string {
	t.Helper()
	page := render(t, recs)
	if edit != nil {
		page = edit(page)
	}
	p := filepath.Join(t.TempDir(), "report.html")
	if err := os.WriteFile(p, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBrowserConsoleErrors: the report of a real job loads without an
// error, and the check would have caught one: the same page with a
// broken script in it reports it, through the page's own record and
// chromium's console log both.
func TestBrowserConsoleErrors(t *testing.T) {
	recs := readFixture(t)
	good := load(t, writePage(t, recs, nil))
	if len(good.errors) > 0 || len(good.console) > 0 {
		t.Errorf("the report has errors: page %q, console %q", good.errors, good.console)
	}
	broken := load(t, writePage(t, recs, func(s string) string {
		return strings.Replace(s, "</body>", "<script>gorunNoSuchFunction();</script></body>", 1)
	}))
	if len(broken.errors) == 0 || !strings.Contains(strings.Join(broken.errors, " "), "gorunNoSuchFunction") {
		t.Errorf("a broken script went unnoticed by the page's record: %q", broken.errors)
	}
	if len(broken.console) == 0 {
		t.Errorf("a broken script went unnoticed in chromium's console log")
	}
}

// TestBrowserShowsRecovery: a screenshot of the report shows the failure
// marker where the page laid it out (on the lost host's row) and the
// spare's takeover marker; the report of the same job without its
// failure record has no marker colour there.
func TestBrowserShowsRecovery(t *testing.T) {
	recs := readFixture(t)
	page := writePage(t, recs, nil)
	l := load(t, page)
	fail, ok := l.markers["failure"]
	if !ok {
		t.Fatalf("no failure marker laid out: %v", l.markers)
	}
	take, ok := l.markers["takeover"]
	if !ok {
		t.Fatalf("no takeover marker laid out: %v", l.markers)
	}
	// Each marker on its host's row: the failure on the lost host's
	// (the failure record's), the takeover on the spare's, as the
	// browser laid out the rows (the page's script writes their boxes).
	m, err := Build(recs)
	if err != nil {
		t.Fatal(err)
	}
	lost, spare := m.Failures[0].Host, slices.IndexFunc(m.Hosts, func(h HostRow) bool { return h.Takeover != nil })
	if lost < 0 || spare < 0 || lost == spare {
		t.Fatalf("the fixture's failure on row %d, takeover on row %d", lost, spare)
	}
	for _, c := range []struct {
		name string
		box  image.Rectangle
		row  int
	}{{"failure", fail, lost}, {"takeover", take, spare}} {
		row, ok := l.markers[fmt.Sprintf("row-%d", c.row)]
		if !ok {
			t.Fatalf("no box of row %d laid out: %v", c.row, l.markers)
		}
		if c.box.Min.Y < row.Min.Y || c.box.Max.Y > row.Max.Y || c.box.Dy() <= 0 {
			t.Errorf("the %s marker %v is not inside row %d (%s) %v", c.name, c.box, c.row, m.Hosts[c.row].Name, row)
		}
	}
	img := screenshot(t, page)
	if f := coverage(img, fail, FailureColour); f < 0.5 {
		t.Errorf("the failure marker's box %v has %.0f%% of its colour %s on the screenshot, want at least half", fail, 100*f, FailureColour)
	}
	if f := coverage(img, take, TakeoverColour); f < 0.5 {
		t.Errorf("the takeover marker's box %v has %.0f%% of its colour on the screenshot, want at least half", take, 100*f)
	}
	// The same job's report without the failure: no marker there.
	var without []events.Record
	for _, r := range recs {
		if _, ok := r.Event.(events.Failure); !ok {
			without = append(without, r)
		}
	}
	if f := coverage(screenshot(t, writePage(t, without, nil)), fail, FailureColour); f > 0 {
		t.Errorf("a report without failures has %.0f%% of the failure colour in the marker's box", 100*f)
	}
}

func screenshot(t *testing.T, page string) image.Image {
	t.Helper()
	shot := filepath.Join(t.TempDir(), "shot.png")
	browse(t, page, "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("the screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != windowW || b.Dy() != windowH {
		t.Fatalf("screenshot of %v, want %dx%d", b, windowW, windowH)
	}
	return img
}

// coverage is the fraction of r's pixels in img of colour hex.
func coverage(img image.Image, r image.Rectangle, hex string) float64 {
	want := parseHex(hex)
	r = r.Intersect(img.Bounds())
	if r.Empty() {
		return 0
	}
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c := color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
			if c.R == want.R && c.G == want.G && c.B == want.B {
				n++
			}
		}
	}
	return float64(n) / float64(r.Dx()*r.Dy())
}

func parseHex(s string) color.NRGBA {
	v, _ := strconv.ParseUint(strings.TrimPrefix(s, "#"), 16, 32)
	return color.NRGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 255}
}
