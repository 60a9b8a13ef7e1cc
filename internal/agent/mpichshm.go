package agent

// MPICH's intranode shared-memory segment: MPL's mmap backend (MPICH 4,
// mpicc.mpich) creates it with mkstemp on the template
// /dev/shm/mpich_shar_tmpXXXXXX in the host's first rank, sizes it and
// maps it, and passes its name to the host's other ranks, which open and
// map it; once all have attached, the creator unlinks it. A rank killed
// in that window (MPI_Init) leaves the file behind, forever: it is not
// named after the job, so nothing else of gorun's knows it. The agents'
// sweeps of /dev/shm (sweepShm: at the start, beside the launch; at the
// end, after the ranks are gone; gorun clean) remove the ones nobody can
// still use.
//
// When is such a file garbage? It is this user's (mkstemp makes it 0600,
// so only this user's processes, and root's, can open it), and no
// process has it open or mapped. That holds for no live segment at any
// moment of its life:
//
//   - the creator's mkstemp returns it open (open(O_CREAT|O_EXCL)), and
//     the creator keeps that descriptor until it has mapped the file
//     (ftruncate or a write to size it, then mmap): from its creation
//     until the mmap, the creator has it open; from the mmap on, mapped
//     (whether it closes the descriptor afterwards or keeps it). The
//     mapping lasts as long as the ranks use the segment: it goes at
//     MPI_Finalize, after the unlink, or with the process;
//   - the other ranks open it by name and map it while the creator
//     still has it mapped (the unlink waits for them all).
//
// (MPL_shm_seg_create_attach_templ in src/mpl/src/shm/mpl_shm_mmap.c:
// mkstemp, lseek and write a byte to size it, mmap, close; callers in
// src/mpid/common/shm: MPIDU_Init_shm_init and shm_alloc create and
// attach at once, broadcast the name, the others attach, a barrier or
// allreduce, then MPL_shm_seg_remove; the segment is detached at
// finalize, after the unlink. The one path that unmaps a file it has not
// unlinked, map_symm_shm's failure, never maps that file again: its
// retry makes a new one, so the old one is garbage as soon as it is
// unused.) When mkstemp fails in /dev/shm, MPL falls back to
// /tmp/mpich_shar_tmpXXXXXX: those are not looked for.
//
// Every process (/proc/<pid>, its thread group: a thread that unshared
// its descriptor table is not read apart) is read descriptors first
// (/proc/<pid>/fd), mappings after (/proc/<pid>/maps): a process that
// maps and then closes between the two reads is seen in the second. One window is left: open(2)
// makes the name visible in the directory slightly before it installs
// the descriptor in the creator's table, so a sweep reading the
// directory and then the creator's descriptors inside that one system
// call would see an unused file. A minimum age closes it (mpichMinAge,
// judged on the file's modification time, which mkstemp sets at the
// creation and which only the creator moves forward).
//
// A process whose /proc entries cannot be read (another user's, when the
// agent is not root; a non-dumpable one; one with capabilities the
// agent lacks, as a container's init is to a root agent without
// CAP_SYS_PTRACE): what the sweep decides is in procScan.mayHold. One of
// another user's cannot open a 0600 file of this user's, so it is passed
// over (root's processes are this user's when the agent is root). One
// with capabilities the agent lacks is passed over too: it is no rank of
// a gorun agent like this one (ranks run with their agent's credentials,
// and the agents of a user on a host are started alike, by ssh or the
// launcher), and without that no root agent in a container could sweep
// at all. Any other process of this user's that cannot be read (a
// non-dumpable one, an LSM's refusal) may hold a file: then no file is
// removed in that sweep, and the sweep says which process it could not
// read. Being wrong that way only leaves a file; the other way would
// break a running job. The one case that way round: an agent running
// with fewer capabilities than another agent of the same user on the
// same host would not see that one's ranks.
//
// Open MPI's shared-memory files are not covered here: gorun puts them
// in its own per-job directories (ompiDir), swept by their lock.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// mpichShmPrefix begins the names of MPICH's segment files; mkstemp
	// puts six letters or digits after it.
	mpichShmPrefix = "mpich_shar_tmp"
	// mpichMinAge is how old (by modification time) an unused segment
	// file must be to be removed: far above the length of the open(2)
	// that creates it (see above).
	mpichMinAge = 2 * time.Second
)

// errProcUnreadable says that a process that may hold a file could not be
// read: the files are kept.
var errProcUnreadable = errors.New("a process of this user's cannot be read in /proc")

// mpichShmName says whether name is one of MPICH's segment files:
// mpich_shar_tmp and the six characters mkstemp puts there.
func mpichShmName(name string) bool {
	rest, ok := strings.CutPrefix(name, mpichShmPrefix)
	if !ok || len(rest) != 6 {
		return false
	}
	for _, c := range []byte(rest) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// fileID names a file by its device and inode, as /proc/<pid>/maps does
// and a stat does: paths differ between mount namespaces, these do not.
type fileID struct{ dev, ino uint64 }

// procHolders reports which of want some process has open or mapped; an
// error (errProcUnreadable among them) means it could not tell, and
// nothing may be removed.
type procHolders func(want map[fileID]bool) (map[fileID]bool, error)

// procScan reads the processes of a /proc (root; tests give a tree of
// their own) for uid, this user, whose effective capabilities are capEff.
type procScan struct {
	root   string
	uid    int
	capEff uint64
}

// hostProcs is the host's /proc, judged for this process's user and
// capabilities.
func hostProcs() procScan {
	p := procScan{root: "/proc", uid: os.Getuid()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		p.capEff, _ = statusCapEff(b)
	}
	return p
}

// holders is procHolders over p.
func (p procScan) holders(want map[fileID]bool) (map[fileID]bool, error) {
	d, err := os.Open(p.root)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p.root, err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p.root, err)
	}
	held := map[fileID]bool{}
	var unreadable []string
	for _, name := range names {
		if _, err := strconv.Atoi(name); err != nil {
			continue // not a process
		}
		dir := filepath.Join(p.root, name)
		// Descriptors first, mappings after (see the file's comment).
		ferr := p.openFiles(dir, want, held)
		merr := mappedFiles(filepath.Join(dir, "maps"), want, held)
		if gone(ferr) || gone(merr) {
			continue // it ended: it holds nothing
		}
		if ferr == nil && merr == nil {
			continue
		}
		if p.mayHold(dir) {
			unreadable = append(unreadable, fmt.Sprintf("%s (%v)", name, errors.Join(ferr, merr)))
		}
	}
	if len(unreadable) > 0 {
		return held, fmt.Errorf("%w: %s", errProcUnreadable, strings.Join(unreadable, ", "))
	}
	return held, nil
}

// gone says whether err is that of a process that ended while it was read.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// openFiles marks in held the files of want that process dir has open.
// Only descriptors whose link names an MPICH segment are looked at
// closer (a stat): the name is the same in every mount namespace.
func (p procScan) openFiles(dir string, want, held map[fileID]bool) error {
	fdDir := filepath.Join(dir, "fd")
	d, err := os.Open(fdDir)
	if err != nil {
		return err
	}
	fds, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fdDir, fd))
		if errors.Is(err, fs.ErrNotExist) {
			continue // closed meanwhile
		}
		if err != nil {
			return err
		}
		if !mpichShmName(filepath.Base(strings.TrimSuffix(link, " (deleted)"))) {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(fdDir, fd), &st) != nil {
			continue
		}
		if id := (fileID{uint64(st.Dev), st.Ino}); want[id] {
			held[id] = true
		}
	}
	return nil
}

// mappedFiles marks in held the files of want that the maps file path
// lists: "address perms offset major:minor inode path" per mapping.
func mappedFiles(path string, want, held map[fileID]bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[4] == "0" {
			continue // anonymous
		}
		majMin := strings.SplitN(f[3], ":", 2)
		if len(majMin) != 2 {
			continue
		}
		maj, err1 := strconv.ParseUint(majMin[0], 16, 32)
		min, err2 := strconv.ParseUint(majMin[1], 16, 32)
		ino, err3 := strconv.ParseUint(f[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		if id := (fileID{mkdev(maj, min), ino}); want[id] {
			held[id] = true
		}
	}
	return sc.Err()
}

// mkdev is Linux's encoding of a device number in st_dev (glibc's
// gnu_dev_makedev).
func mkdev(major, minor uint64) uint64 {
	return (major&0xfff)<<8 | (major&^0xfff)<<32 | minor&0xff | (minor&^0xff)<<12
}

// mayHold says whether the process in dir, whose descriptors or mappings
// could not be read, may have a 0600 file of p.uid's open (see the
// file's comment): it runs with that user's real or effective uid (its
// status's Uid line) and has no effective capability p lacks, or its
// status cannot be read either.
func (p procScan) mayHold(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return !gone(err)
	}
	ours := false
	for l := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(l, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		for _, u := range f[:min(2, len(f))] {
			ours = ours || u == strconv.Itoa(p.uid)
		}
	}
	if !ours {
		return false
	}
	capEff, ok := statusCapEff(b)
	return !ok || capEff&^p.capEff == 0
}

// statusCapEff returns the CapEff of a /proc/<pid>/status.
func statusCapEff(status []byte) (uint64, bool) {
	for l := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "CapEff:"); ok {
			c, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
			return c, err == nil
		}
	}
	return 0, false
}

// mpichSweep is what sweepShm needs to judge MPICH's segment files; its
// zero value judges none.
type mpichSweep struct {
	holders procHolders      // nil: MPICH's files are not looked at
	uid     int              // this user
	now     func() time.Time // nil: time.Now
}

// hostMPICHSweep judges MPICH's files with the host's /proc.
func hostMPICHSweep() mpichSweep {
	p := hostProcs()
	return mpichSweep{holders: p.holders, uid: p.uid}
}

// mpichCandidate is an MPICH segment file of this user's.
type mpichCandidate struct {
	name string
	id   fileID
	mod  time.Time
}

// candidate returns name's file in dir if it is a regular file of m's
// user's (never through a link).
func (m mpichSweep) candidate(dir, name string) (mpichCandidate, bool) {
	var st syscall.Stat_t
	if syscall.Lstat(filepath.Join(dir, name), &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Uid != uint32(m.uid) {
		return mpichCandidate{}, false
	}
	return mpichCandidate{name: name, id: fileID{uint64(st.Dev), st.Ino}, mod: time.Unix(st.Mtim.Unix())}, true
}

// sweep removes (dry: lists) the candidates in dir that are old enough
// and that no process holds. young is when the youngest unused one
// kept for its age becomes old enough (zero: none was).
func (m mpichSweep) sweep(dir string, cands []mpichCandidate, dry bool) (swept []string, young time.Time, err error) {
	if len(cands) == 0 || m.holders == nil {
		return nil, time.Time{}, nil
	}
	now := time.Now
	if m.now != nil {
		now = m.now
	}
	start := now() // before the scan: a file modified after it is young
	want := make(map[fileID]bool, len(cands))
	for _, c := range cands {
		want[c.id] = true
	}
	held, err := m.holders(want)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("MPICH's shared-memory files in %s kept: %w", dir, err)
	}
	var errs []error
	for _, c := range cands {
		if held[c.id] {
			continue
		}
		if ripe := c.mod.Add(mpichMinAge); ripe.After(start) {
			if ripe.After(young) {
				young = ripe
			}
			continue
		}
		path := filepath.Join(dir, c.name)
		if !dry {
			// Still the file judged: a new one of the same name (mkstemp
			// picked it again) is not removed.
			if cur, ok := m.candidate(dir, c.name); !ok || cur.id != c.id {
				continue
			}
			if err := os.Remove(path); err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
				continue
			}
		}
		swept = append(swept, c.name)
	}
	return swept, young, errors.Join(errs...)
}

// UnusedMPICHFiles returns the names of the MPICH segment files in dir
// (a /dev/shm) that the agents' sweep would remove now: this user's, old
// enough, used by no process of the host. It removes nothing. The chaos
// suite's leak check judges with it.
func UnusedMPICHFiles(dir string) ([]string, error) {
	names, err := readNames(dir)
	if err != nil {
		return nil, err
	}
	m := hostMPICHSweep()
	var cands []mpichCandidate
	for _, name := range names {
		if !mpichShmName(name) {
			continue
		}
		if c, ok := m.candidate(dir, name); ok {
			cands = append(cands, c)
		}
	}
	unused, _, err := m.sweep(dir, cands, true)
	return unused, err
}

// MPICHShmName says whether name is that of an MPICH segment file
// (mpich_shar_tmp and six letters or digits).
func MPICHShmName(name string) bool { return mpichShmName(name) }
