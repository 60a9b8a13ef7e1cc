package jobstatus

import (
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
// directory of the user's own, mode 0700 ($XDG_RUNTIME_DIR/gorun when
// XDG_RUNTIME_DIR is set, else os.TempDir()/gorun-<uid>). A directory
// that is not the user's, or that others may write, is refused: another
// user could plant entries there, or read the credentials. The launcher
// writes its entry once the control plane is up and removes it at its
// end, with the directory once empty; the entry of a launcher that died
// without (SIGKILL) is removed by the next List.

// ErrBadRegistry is returned for a registry directory that is unsafe to
// use: not a directory, not the user's, or writable by others.
var ErrBadRegistry = errors.New("jobstatus: unsafe registry directory")

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
}

// Dir is the user's registry directory (it may not exist).
func Dir() string {
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "gorun")
	}
	return filepath.Join(os.TempDir(), "gorun-"+strconv.Itoa(os.Getuid()))
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

// Register writes e into dir (made 0700 if missing) and returns the
// function that removes it, and dir if empty then.
func Register(dir string, e *Entry) (remove func(), err error) {
	if !wire.ValidJobID(e.Job) {
		return nil, fmt.Errorf("jobstatus: invalid job id %q", e.Job)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("jobstatus: %w", err)
	}
	path := filepath.Join(dir, e.Job+".json")
	// Twice: another job's launcher may remove the directory, empty,
	// between our Mkdir and our file.
	for try := 0; ; try++ {
		if err = os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("jobstatus: registry: %w", err)
		}
		if err = checkDir(dir); err != nil {
			return nil, fmt.Errorf("jobstatus: registry: %w", err)
		}
		err = writeFile(path, b)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || try == 1 {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jobstatus: registry: %w", err)
	}
	return func() { removeEntry(dir, path) }, nil
}

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
		if !alive(e.PID) {
			removeEntry(dir, path)
			continue
		}
		out = append(out, &e)
	}
	slices.SortFunc(out, func(a, b *Entry) int { return a.Start.Compare(b.Start) })
	return out, nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
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
