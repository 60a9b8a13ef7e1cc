package difflogtest

import (
	"bytes"
	"errors"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// WatchOpens watches dir for files opened in it (inotify IN_OPEN) and
// returns a function that returns the names opened since, in order.
// Events are queued when a file is opened, so what a call that returned
// opened is there at once. Where inotify is not available it skips the
// test, saying why.
func WatchOpens(t testing.TB, dir string) func() []string {
	t.Helper()
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		t.Skipf("no inotify here (%v): cannot see which files are opened", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_OPEN); err != nil {
		t.Fatalf("inotify %s: %v", dir, err)
	}
	return func() []string {
		var names []string
		buf := make([]byte, 64<<10)
		for {
			n, err := syscall.Read(fd, buf)
			if errors.Is(err, syscall.EAGAIN) {
				return names
			}
			if err != nil {
				t.Fatalf("inotify: %v", err)
			}
			for off := 0; off+syscall.SizeofInotifyEvent <= n; {
				ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
				if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
					t.Fatal("inotify: queue overflow")
				}
				name := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
				names = append(names, string(bytes.TrimRight(name, "\x00")))
				off += syscall.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// BatchesOpened returns the batch files (diff.*) among names.
func BatchesOpened(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "diff.") {
			out = append(out, n)
		}
	}
	return out
}
