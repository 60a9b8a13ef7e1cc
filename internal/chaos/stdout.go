package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pipeSize is the capacity StdoutStall shrinks gorun's standard output
// pipe to (F_SETPIPE_SZ; one page, the least Linux gives).
const pipeSize = 4096

// filler is what stall writes into gorun's standard output pipe to fill
// it: each write of it is atomic (shorter than PIPE_BUF), so cutting
// every one out of the text gives back gorun's bytes exactly, wherever
// they fell between gorun's writes.
const filler = "\x00chaos-stall-filler\x00"

// pipeOut is gorun's standard output: a pipe shrunk to pipeSize, read
// into a buffer by its reader goroutine (started by start, ended by EOF
// or close). stall stops the reader and fills the pipe to the brim, so
// that gorun's next write blocks as on a paused pager's pipe.
type pipeOut struct {
	r, w *os.File // w goes to gorun as its descriptor 1, closed here once it started
	fill int      // a non-blocking descriptor of the pipe's write end (its own open file description), -1 once closed
	size int      // the pipe's capacity

	mu     sync.Mutex // guards buf, gate and fill
	buf    bytes.Buffer
	gate   chan struct{} // non-nil while stalled; closed to release
	parked chan struct{} // the reader says it stopped at the gate
	done   chan struct{} // closed when the reader returned
}

// newPipeOut makes the pipe, shrunk to pipeSize.
func newPipeOut() (*pipeOut, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("chaos: gorun's stdout pipe: %w", err)
	}
	o := &pipeOut{r: r, w: w, fill: -1, parked: make(chan struct{}, 1), done: make(chan struct{})}
	fail := func(what string, err error) (*pipeOut, error) {
		r.Close()
		w.Close()
		if o.fill >= 0 {
			unix.Close(o.fill)
		}
		return nil, fmt.Errorf("chaos: gorun's stdout pipe: %s: %w", what, err)
	}
	if o.size, err = unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, pipeSize); err != nil {
		return fail("F_SETPIPE_SZ", err)
	}
	// Opening the pipe by its /proc path gives a new open file
	// description: O_NONBLOCK on it leaves gorun's blocking.
	if o.fill, err = unix.Open("/proc/self/fd/"+strconv.Itoa(int(w.Fd())), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
		return fail("opening its write end again", err)
	}
	return o, nil
}

// started is called once gorun started: the parent's copy of the write
// end goes, and the reader starts.
func (o *pipeOut) started() {
	o.w.Close()
	go o.read()
}

// read reads the pipe until EOF, stopping at the gate while stalled.
func (o *pipeOut) read() {
	defer close(o.done)
	b := make([]byte, 32<<10)
	for {
		o.mu.Lock()
		g := o.gate
		o.mu.Unlock()
		if g != nil {
			select {
			case o.parked <- struct{}{}:
			default:
			}
			<-g
		}
		n, err := o.r.Read(b)
		o.mu.Lock()
		o.buf.Write(b[:n])
		o.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// finish is called once gorun exited: the filler's descriptor goes, and
// the reader is given limit to read to EOF (a process of the job still
// holding the pipe is the leak check's to find), then stopped.
func (o *pipeOut) finish(limit time.Duration) {
	o.closeFill()
	select {
	case <-o.done:
	case <-time.After(limit):
		o.r.Close()
		<-o.done
	}
	o.r.Close()
}

func (o *pipeOut) closeFill() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fill >= 0 {
		unix.Close(o.fill)
		o.fill = -1
	}
}

// stall stops the reader and fills the pipe; release starts reading
// again and says whether the pipe was still full then (FIONREAD: no room
// for another filler, so a write of gorun's blocked).
func (o *pipeOut) stall() (release func() (full bool, err error), err error) {
	g := make(chan struct{})
	o.mu.Lock()
	o.gate = g
	fd := o.fill
	o.mu.Unlock()
	unstall := func() {
		o.mu.Lock()
		o.gate = nil
		o.mu.Unlock()
		close(g)
	}
	if fd < 0 {
		unstall()
		return nil, errors.New("chaos: stalling gorun's stdout: gorun exited")
	}
	// One filler wakes a read under way; the reader then stops at the
	// gate.
	if _, err := unix.Write(fd, []byte(filler)); err != nil && !errors.Is(err, unix.EAGAIN) {
		unstall()
		return nil, fmt.Errorf("chaos: stalling gorun's stdout: %w", err)
	}
	select {
	case <-o.parked:
	case <-o.done:
		unstall()
		return nil, fmt.Errorf("%w: stalling gorun's stdout", ErrJobEnded)
	case <-time.After(10 * time.Second):
		unstall()
		return nil, errors.New("chaos: stalling gorun's stdout: its reader did not stop within 10s")
	}
	for {
		_, err := unix.Write(fd, []byte(filler))
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			unstall()
			return nil, fmt.Errorf("chaos: filling gorun's stdout pipe: %w", err)
		}
	}
	return func() (bool, error) {
		defer unstall()
		defer o.closeFill()
		n, err := o.queued()
		if err != nil {
			return false, err
		}
		return n > o.size-len(filler), nil
	}, nil
}

// queued is how many bytes the pipe holds (FIONREAD).
func (o *pipeOut) queued() (int, error) {
	c, err := o.r.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("chaos: gorun's stdout pipe: %w", err)
	}
	var n int
	var ierr error
	if err := c.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil {
		return 0, fmt.Errorf("chaos: gorun's stdout pipe: %w", err)
	}
	if ierr != nil {
		return 0, fmt.Errorf("chaos: FIONREAD on gorun's stdout pipe: %w", ierr)
	}
	return n, nil
}

// String is what gorun wrote so far, the filler cut out.
func (o *pipeOut) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.ReplaceAll(o.buf.String(), filler, "")
}

// writeBlocked reports whether a thread of process pid is in a write(2)
// to its descriptor fd or to another descriptor of the same file (gorun
// writes its output through a duplicate of descriptor 1: cmd/gorun's
// undying), as gorun's is when its standard output pipe is full and
// unread: /proc/PID/task/*/syscall gives the system call's number and
// first argument. Threads and descriptors that go meanwhile are skipped.
func writeBlocked(pid, fd int) (bool, error) {
	target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
	if err != nil {
		return false, fmt.Errorf("chaos: descriptor %d of pid %d: %w", fd, pid, err)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, fmt.Errorf("chaos: the descriptors of pid %d: %w", pid, err)
	}
	var want []string
	for _, e := range fds {
		if t, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && t == target {
			n, _ := strconv.Atoi(e.Name())
			want = append(want, fmt.Sprintf("%d 0x%x ", unix.SYS_WRITE, n))
		}
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, fmt.Errorf("chaos: the threads of pid %d: %w", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/syscall", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, w := range want {
			if strings.HasPrefix(string(b), w) {
				return true, nil
			}
		}
	}
	return false, nil
}
