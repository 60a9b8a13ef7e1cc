package jobstatus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// The registry: one file per running job, <job>.json, mode 0600, in a
// directory of the user's own, mode 0700: the first of the candidates
// (Dirs: $XDG_RUNTIME_DIR/gorun when XDG_RUNTIME_DIR is set, else
// os.TempDir()/gorun-<uid>, … $HOME/.local/state/gorun) where the
// launcher can make and use it (RegisterFirst); gorun status searches
// them all (ListAll), since it may run in another environment. A
// directory that is not the user's, or that others may write, is
// refused: another user could plant entries there, or read the
// credentials. The launcher writes its entry once the control plane is
// up and removes it at its end, with the directory once empty; the entry
// of a launcher that died without (SIGKILL), or whose PID another
// process now has, is removed by the next List; another host's entry (a
// shared directory) is neither listed nor removed.

// ErrBadRegistry is returned for a registry directory that is unsafe to
// use: not a directory, not the user's, or writable by others.
var ErrBadRegistry = errors.New("unsafe registry directory")

// Entry is a running job's registry entry.
type Entry struct {
	Job   string    `json:"job"`
	PID   int       `json:"pid"`
	Start time.Time `json:"start"`
	Prog  string    `json:"prog"`
	// URL is where the control plane listens for status clients.
	URL string `json:"url"`
	// Pin is the hex SHA-256 of the control plane's TLS certificate, ""
	// without TLS (loopback).
	Pin string `json:"pin,omitempty"`
	// Seed is the status credential: the nkey seed of the job's status
	// user. It is secret: it lets its holder read the job's status (and
	// nothing else).
	Seed       string `json:"seed"`
	MetricsURL string `json:"metrics_url,omitempty"`
	// Host is the launcher's host name, PIDStart its process's start
	// time (/proc/PID/stat's field 22, clock ticks since boot): the
	// entry is stale once PID is another process or a zombie, and only
	// Host can tell (Register fills both if zero).
	Host     string `json:"host,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Dir is the registry directory List found the entry in (not
	// written).
	Dir string `json:"-"`
}

// Dirs are the candidate registry directories, in the order a launcher
// tries them (RegisterFirst) and all of which gorun status searches
// (ListAll): $XDG_RUNTIME_DIR/gorun when XDG_RUNTIME_DIR is set,
// os.TempDir()/gorun-<uid>, /tmp/gorun-<uid> if TMPDIR names another,
// /run/user/<uid>/gorun when /run/user/<uid> exists (systemd's
// XDG_RUNTIME_DIR, for a client without the variable), and
// $HOME/.local/state/gorun. A job started in another environment
// (cron, nohup under su, a batch script without XDG_RUNTIME_DIR, or
// with one that cannot be made) is found all the same.
func Dirs() []string {
	var ds []string
	add := func(d string) {
		if filepath.IsAbs(d) && !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" {
		add(filepath.Join(x, "gorun"))
	}
	uid := strconv.Itoa(os.Getuid())
	add(filepath.Join(os.TempDir(), "gorun-"+uid))
	add(filepath.Join("/tmp", "gorun-"+uid))
	if fi, err := os.Stat(filepath.Join("/run/user", uid)); err == nil && fi.IsDir() {
		add(filepath.Join("/run/user", uid, "gorun")) // systemd's XDG_RUNTIME_DIR
	}
	if home, err := os.UserHomeDir(); err == nil {
		add(filepath.Join(home, ".local", "state", "gorun"))
	}
	return ds
}

// RegisterFirst registers e (Register) in the first of dirs where it
// can, and returns that directory; the error is every directory's when
// none can take it.
func RegisterFirst(dirs []string, e *Entry) (dir string, remove func(), err error) {
	var errs []error
	for _, d := range dirs {
		rm, err := Register(d, e)
		if err == nil {
			return d, rm, nil
		}
		errs = append(errs, err)
		if !wire.ValidJobID(e.Job) {
			break
		}
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("jobstatus: no registry directory"))
	}
	return "", nil, errors.Join(errs...)
}

// ListAll returns the running jobs' entries in every one of dirs, oldest
// first, each job once (List). A directory that is unsafe (another
// user's: ErrBadRegistry) or unreadable is skipped; its error is
// returned only when no directory could be read.
func ListAll(dirs []string) ([]*Entry, error) {
	var out []*Entry
	var errs []error
	read := 0
	for _, d := range dirs {
		es, err := List(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		read++
		for _, e := range es {
			if !slices.ContainsFunc(out, func(x *Entry) bool { return x.Job == e.Job }) {
				out = append(out, e)
			}
		}
	}
	if read == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortStableFunc(out, func(a, b *Entry) int { return a.Start.Compare(b.Start) })
	return out, nil
}

// checkDir refuses dir unless it is a directory owned by the user that
// nobody else can write (nor, being 0700, read).
func checkDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrBadRegistry, dir)
	case !ok || int(st.Uid) != os.Getuid():
		return fmt.Errorf("%w: %s is not owned by uid %d", ErrBadRegistry, dir, os.Getuid())
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%w: %s has mode %v; want 0700", ErrBadRegistry, dir, fi.Mode().Perm())
	}
	return nil
}

// Register writes e into dir (made 0700 if missing), with this host's
// name and the start time of process e.PID if e has none, and returns
// the function that removes it, and dir if empty then.
func Register(dir string, e *Entry) (remove func(), err error) {
	if !wire.ValidJobID(e.Job) {
		return nil, fmt.Errorf("jobstatus: invalid job id %q", e.Job)
	}
	x := *e
	e = &x
	if e.Host == "" {
		e.Host, _ = os.Hostname()
	}
	if e.PIDStart == 0 {
		e.PIDStart, _ = procStart(e.PID)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("jobstatus: %w", err)
	}
	path := filepath.Join(dir, e.Job+".json")
	// Again while the directory goes: another job's launcher, or gorun
	// status removing a stale entry, removes it once empty, at any
	// moment between our Mkdir and our file.
	if _, err := os.Lstat(filepath.Dir(dir)); errors.Is(err, fs.ErrNotExist) {
		// ($HOME/.local/state, say.)
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return nil, fmt.Errorf("jobstatus: registry: %w", err)
		}
	}
	for try := 0; ; try++ {
		err = os.Mkdir(dir, 0o700)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("jobstatus: registry: %w", err)
		}
		if testHookMkdir != nil {
			testHookMkdir()
		}
		if err = checkDir(dir); err == nil {
			err = writeFile(path, b)
		}
		if err == nil || !errors.Is(err, fs.ErrNotExist) || try == registerTries-1 {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jobstatus: registry: %w", err)
	}
	return func() { removeEntry(dir, path) }, nil
}

// registerTries bounds Register's attempts while the directory goes.
const registerTries = 20

// testHookMkdir, if set, runs between Register's Mkdir and the rest.
var testHookMkdir func()

// writeFile writes b to path, 0600, whole or not at all.
func writeFile(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp") // 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// Remove removes e's entry from dir (and dir if that empties it): a
// stale entry its launcher did not remove.
func Remove(dir string, e *Entry) {
	if wire.ValidJobID(e.Job) {
		removeEntry(dir, filepath.Join(dir, e.Job+".json"))
	}
}

func removeEntry(dir, path string) {
	_ = os.Remove(path)
	_ = os.Remove(dir) // only if empty: ENOTEMPTY otherwise
}

// List returns the running jobs' entries in dir, oldest first. An entry
// whose launcher is gone is removed (and dir if that empties it); an
// unreadable one is skipped. No directory: no job.
func List(dir string) ([]*Entry, error) {
	if err := checkDir(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("jobstatus: registry: %w", err)
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("jobstatus: registry: %w", err)
	}
	var out []*Entry
	for _, de := range des {
		name := de.Name()
		job, ok := strings.CutSuffix(name, ".json")
		if !ok || !de.Type().IsRegular() || !wire.ValidJobID(job) {
			continue
		}
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var e Entry
		if json.Unmarshal(b, &e) != nil || e.Job != job {
			continue
		}
		switch liveness(&e) {
		case stale:
			removeEntry(dir, path)
		case live:
			e.Dir = dir
			out = append(out, &e)
		}
	}
	slices.SortFunc(out, func(a, b *Entry) int { return a.Start.Compare(b.Start) })
	return out, nil
}

type life int

const (
	live      life = iota
	stale          // the launcher is gone: the entry may go
	elsewhere      // another host's: not this one's to judge
)

// liveness tells whether e's launcher runs: its host is this one, and
// its PID names a process that is not a zombie and started when e says
// (a PID reused, or a launcher SIGKILLed and not yet reaped, is stale).
func liveness(e *Entry) life {
	if host, err := os.Hostname(); err == nil && e.Host != "" && e.Host != host {
		return elsewhere
	}
	if e.PID <= 0 {
		return stale
	}
	start, state, err := procStat(e.PID)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return stale
	case err != nil:
		// No /proc to read: whether the PID exists is all there is.
		if err := syscall.Kill(e.PID, 0); err == nil || errors.Is(err, syscall.EPERM) {
			return live
		}
		return stale
	case state == 'Z' || state == 'X' || start != e.PIDStart:
		return stale
	}
	return live
}

// ErrNoJob and ErrAmbiguous are Find's answers when no entry, or more
// than one, matches.
var (
	ErrNoJob     = errors.New("jobstatus: no running job")
	ErrAmbiguous = errors.New("jobstatus: several running jobs match")
)

// Find returns the entry among es whose job id is id or starts with it.
// With id "" there must be exactly one entry.
func Find(es []*Entry, id string) (*Entry, error) {
	var m []*Entry
	for _, e := range es {
		if e.Job == id {
			return e, nil
		}
		if strings.HasPrefix(e.Job, id) {
			m = append(m, e)
		}
	}
	switch len(m) {
	case 0:
		if id == "" {
			return nil, ErrNoJob
		}
		return nil, fmt.Errorf("%w with id %q", ErrNoJob, id)
	case 1:
		return m[0], nil
	}
	return nil, fmt.Errorf("%w %q (%d)", ErrAmbiguous, id, len(m))
}

// procStart is process pid's start time (/proc/PID/stat's field 22).
func procStart(pid int) (uint64, error) {
	st, _, err := procStat(pid)
	return st, err
}

// procStat reads process pid's start time and state (/proc/PID/stat's
// fields 22 and 3).
func procStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("jobstatus: /proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("jobstatus: /proc/%d/stat: malformed", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("jobstatus: /proc/%d/stat: %w", pid, err)
	}
	return start, f[0][0], nil
}
