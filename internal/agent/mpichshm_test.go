package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// makeShmFile writes an MPICH-like segment file name in dir, modified
// age ago, and returns its path.
func makeShmFile(t *testing.T, dir, name string, age time.Duration) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-age)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSweepMPICHFiles: the shm sweep, judged with the host's real /proc,
// keeps an MPICH segment file this process has open, one it has only
// mapped (descriptor closed), one too young, another user's, a link and
// names that are not MPICH's; it removes the old unused one, and with
// dry only lists it.
func TestSweepMPICHFiles(t *testing.T) {
	old := time.Minute
	for _, dry := range []bool{false, true} {
		t.Run(fmt.Sprintf("dry=%v", dry), func(t *testing.T) {
			dir := t.TempDir()
			open := makeShmFile(t, dir, "mpich_shar_tmpOpen01", old)
			f, err := os.Open(open)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			mapped := makeShmFile(t, dir, "mpich_shar_tmpMaps01", old)
			mf, err := os.OpenFile(mapped, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			mem, err := syscall.Mmap(int(mf.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
			mf.Close() // mapped only, as a rank after its attach
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Munmap(mem)
			unused := makeShmFile(t, dir, "mpich_shar_tmpGone01", old)
			young := makeShmFile(t, dir, "mpich_shar_tmpYoung1", 0)
			keep := []string{open, mapped, young}
			for _, name := range []string{"mpich_shar_tmpX", "mpich_shar_tmp1234567", "mpich_shar_tmp12345_", "other_tmp123456", "gorun-job.0"} {
				keep = append(keep, makeShmFile(t, dir, name, old))
			}
			link := filepath.Join(dir, "mpich_shar_tmpLink01")
			if err := os.Symlink(unused, link); err != nil {
				t.Fatal(err)
			}
			keep = append(keep, link)
			if os.Getuid() == 0 {
				theirs := makeShmFile(t, dir, "mpich_shar_tmpTheir1", old)
				if err := os.Chown(theirs, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				keep = append(keep, theirs)
			}
			s, err := sweepShm(dir, "", dry, hostMPICHSweep())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.MPICHFiles, []string{"mpich_shar_tmpGone01"}) || len(s.OMPIDirs) != 0 {
				t.Errorf("swept %+v, want only mpich_shar_tmpGone01", s)
			}
			if s.young.IsZero() {
				t.Error("the young unused file is not reported as young")
			}
			for _, p := range keep {
				if _, err := os.Lstat(p); err != nil {
					t.Errorf("%s: %v (must be left)", filepath.Base(p), err)
				}
			}
			_, err = os.Lstat(unused)
			if gone := errors.Is(err, os.ErrNotExist); gone == dry {
				t.Errorf("the unused file after the sweep (dry %v): %v", dry, err)
			}
		})
	}
}

// TestProcScan: the /proc reader, on a fabricated tree: a descriptor or
// a mapping (by device and inode, not name) makes a file held; a process
// that cannot be read makes the sweep keep everything when it is this
// user's, and is passed over when it is another user's or gone.
func TestProcScan(t *testing.T) {
	shm := t.TempDir()
	a := makeShmFile(t, shm, "mpich_shar_tmpAAAAAA", time.Minute)
	b := makeShmFile(t, shm, "mpich_shar_tmpBBBBBB", time.Minute)
	c := makeShmFile(t, shm, "mpich_shar_tmpCCCCCC", time.Minute)
	idOf := func(p string) (fileID, string) {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		dev := uint64(st.Dev)
		return fileID{dev, st.Ino}, fmt.Sprintf("%02x:%02x %d", unix.Major(dev), unix.Minor(dev), st.Ino)
	}
	idA, _ := idOf(a)
	idB, mapsB := idOf(b)
	idC, _ := idOf(c)
	want := map[fileID]bool{idA: true, idB: true, idC: true}
	uid := os.Getuid()

	// proc makes process pid: fds link to files, maps lines, a status
	// with the uid; fdUnreadable makes its fd entry unreadable.
	type process struct {
		pid          int
		fds          []string
		maps         []string
		uid          int
		fdUnreadable bool
		noStatus     bool
		capEff       uint64
	}
	build := func(t *testing.T, ps []process) string {
		root := t.TempDir()
		if err := os.Mkdir(filepath.Join(root, "self"), 0o700); err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			dir := filepath.Join(root, strconv.Itoa(p.pid))
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if p.fdUnreadable {
				// Not a directory: reading it fails as a denied one does.
				if err := os.WriteFile(filepath.Join(dir, "fd"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := os.Mkdir(filepath.Join(dir, "fd"), 0o700); err != nil {
					t.Fatal(err)
				}
				for i, f := range p.fds {
					if err := os.Symlink(f, filepath.Join(dir, "fd", strconv.Itoa(i))); err != nil {
						t.Fatal(err)
					}
				}
			}
			var maps string
			for _, m := range p.maps {
				maps += "7f0000000000-7f0000001000 rw-s 00000000 " + m + "\n"
			}
			maps += "7f0000002000-7f0000003000 rw-p 00000000 00:00 0 \n"
			if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o600); err != nil {
				t.Fatal(err)
			}
			if p.noStatus {
				// Unreadable (a directory), not missing (an ended process).
				if err := os.Mkdir(filepath.Join(dir, "status"), 0o700); err != nil {
					t.Fatal(err)
				}
			} else {
				status := fmt.Sprintf("Name:\tx\nUid:\t%d\t%d\t%d\t%d\nCapEff:\t%016x\n", p.uid, p.uid, p.uid, p.uid, p.capEff)
				if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		return root
	}
	for _, tc := range []struct {
		name    string
		procs   []process
		held    []fileID
		wantErr error
	}{
		{"open", []process{{pid: 10, fds: []string{a, "/dev/null"}, uid: uid}}, []fileID{idA}, nil},
		{"mapped only", []process{{pid: 11, maps: []string{mapsB + " " + b}, uid: uid}}, []fileID{idB}, nil},
		{"mapped, unlinked name", []process{{pid: 11, maps: []string{mapsB + " /dev/shm/elsewhere (deleted)"}, uid: uid}}, []fileID{idB}, nil},
		{"open and mapped apart", []process{{pid: 10, fds: []string{a}, uid: uid}, {pid: 12, maps: []string{mapsB + " " + b}, uid: uid}}, []fileID{idA, idB}, nil},
		{"nobody", []process{{pid: 10, fds: []string{"/dev/null"}, uid: uid}}, nil, nil},
		{"another user's unreadable", []process{{pid: 13, fdUnreadable: true, uid: uid + 1}}, nil, nil},
		{"this user's unreadable", []process{{pid: 13, fdUnreadable: true, uid: uid}}, nil, errProcUnreadable},
		{"this user's unreadable, fewer capabilities", []process{{pid: 13, fdUnreadable: true, uid: uid, capEff: 0x1}}, nil, errProcUnreadable},
		{"this user's unreadable, more capabilities", []process{{pid: 13, fdUnreadable: true, uid: uid, capEff: 0x3}}, nil, nil},
		{"unreadable, status too", []process{{pid: 13, fdUnreadable: true, noStatus: true}}, nil, errProcUnreadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := procScan{root: build(t, tc.procs), uid: uid, capEff: 0x1}
			held, err := p.holders(want)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("holders: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var got []fileID
			for _, id := range []fileID{idA, idB, idC} {
				if held[id] {
					got = append(got, id)
				}
			}
			if !slices.Equal(got, tc.held) {
				t.Errorf("held %v, want %v", got, tc.held)
			}
		})
	}

	// Through the sweep: an unreadable process of this user's keeps every
	// file; without it, the unheld ones go.
	root := build(t, []process{{pid: 10, fds: []string{a}, uid: uid}, {pid: 13, fdUnreadable: true, uid: uid}})
	m := mpichSweep{holders: procScan{root: root, uid: uid}.holders, uid: uid}
	if s, err := sweepShm(shm, "", false, m); !errors.Is(err, errProcUnreadable) || len(s.MPICHFiles) != 0 {
		t.Errorf("with an unreadable process: %+v, %v; want nothing removed and errProcUnreadable", s, err)
	}
	root = build(t, []process{{pid: 10, fds: []string{a}, uid: uid}})
	m.holders = procScan{root: root, uid: uid}.holders
	s, err := sweepShm(shm, "", false, m)
	if slices.Sort(s.MPICHFiles); err != nil || !slices.Equal(s.MPICHFiles, []string{"mpich_shar_tmpBBBBBB", "mpich_shar_tmpCCCCCC"}) {
		t.Errorf("sweep: %+v, %v; want B and C", s, err)
	}
	if _, err := os.Stat(a); err != nil {
		t.Errorf("the open file: %v", err)
	}
}

func TestMPICHShmName(t *testing.T) {
	for name, want := range map[string]bool{
		"mpich_shar_tmpaB3xZ9":  true,
		"mpich_shar_tmp000000":  true,
		"mpich_shar_tmp":        false,
		"mpich_shar_tmpabcde":   false,
		"mpich_shar_tmpabcdefg": false,
		"mpich_shar_tmpabc.ef":  false,
		"xmpich_shar_tmpabcdef": false,
		"gorun-j-h0-g0":         false,
	} {
		if got := mpichShmName(name); got != want {
			t.Errorf("mpichShmName(%q) = %v, want %v", name, got, want)
		}
	}
}

// mpichCreatorDir is where the mpichcreator helper makes its segment.
const mpichCreatorDir = "AGENTTEST_MPICH_DIR"

// mpichCreator does what MPICH's first rank on a host does in MPI_Init
// (MPL_shm_seg_create_attach_templ): it creates mpich_shar_tmpXXXXXX
// exclusively, writes its last byte to size it, maps it, closes the
// descriptor, prints the path, and keeps the mapping until killed (or
// its stdin ends), never unlinking it: a rank killed before its peers
// attached.
func mpichCreator() int {
	const size = 1 << 16
	path := filepath.Join(os.Getenv(mpichCreatorDir), fmt.Sprintf("mpich_shar_tmp%06d", os.Getpid()%1000000))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := f.WriteAt([]byte{0}, size-1); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	f.Close()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println(path)
	_, _ = io.Copy(io.Discard, os.Stdin)
	mem[0] = 1 // the mapping lives until here
	return 0
}

// TestSweepMPICHCreatorKilled: the segment of another process that has
// it only mapped (MPICH's creator after its attach) is kept; once that
// process is killed, the sweep removes it.
func TestSweepMPICHCreatorKilled(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), agenttestHelper+"=mpichcreator", mpichCreatorDir+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	path := strings.TrimSpace(line)
	if err != nil || !strings.HasPrefix(path, dir) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the creator: %q, %v", line, err)
	}
	old := time.Now().Add(-time.Minute) // past the minimum age: only the use keeps it
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	s, err := sweepShm(dir, "", false, hostMPICHSweep())
	if err != nil || len(s.MPICHFiles) != 0 {
		t.Errorf("with its creator alive: swept %+v, %v; want nothing", s, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the live segment: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // reaped: its mapping is gone
	s, err = sweepShm(dir, "", false, hostMPICHSweep())
	if err != nil || !slices.Equal(s.MPICHFiles, []string{filepath.Base(path)}) {
		t.Errorf("after its creator was killed: swept %+v, %v; want %s", s, err, filepath.Base(path))
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead segment is still there: %v", err)
	}
}
