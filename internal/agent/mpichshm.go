package agent

// MPICH's intranode shared-memory segment files, and when the agents may
// remove one.
//
// The protocol, per file named mpich_shar_tmpXXXXXX in /dev/shm that
// is a regular file of this user's and was last modified mpichMinAge
// ago or more (mpichSweep.remove):
//
//  1. open it O_RDWR|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC (a link is not
//     followed; an open that would break another sweep's lease fails at
//     once with EWOULDBLOCK instead of waiting for it: the file is kept);
//  2. fstat the descriptor: a regular file, this user's, the device and
//     inode the name's lstat gave (else kept);
//  3. take a write lease on it, fcntl(F_SETLEASE, F_WRLCK): the kernel
//     refuses (EAGAIN) while any other open file description of the file
//     exists, in any process, in any PID or mount namespace, and a
//     shared mapping holds one for as long as it lasts, descriptor
//     closed or not. Refused: the file is in use, kept;
//  4. holding the lease, lstat the name again: still the same inode (not
//     a new file mkstemp gave the same name) → unlink it;
//  5. release the lease (F_UNLCK) and close.
//
// (An open by someone else while the lease is held sends this process
// SIGIO, the lease holder's signal, which the Go runtime ignores unless
// it is asked for with signal.Notify; the opener waits for step 5.)
//
// Why that never removes a live segment: a file is garbage when nobody
// has it open or mapped, since nobody can then reach its contents but by
// opening its name, and nobody of MPICH's does that once the creator is
// gone (below). The lease is the kernel's own answer to "does anybody
// else have it open or mapped", taken atomically with respect to new
// opens: while it is held, an open by anyone else breaks it (a blocking
// open waits for the release, after the unlink, then fails with ENOENT:
// the name is gone, nothing half-removed is seen). It reads no /proc, so
// it sees the processes of every PID namespace that shares this /dev/shm
// (docker --ipc=host, a Kubernetes pod's containers) and processes with
// more privileges than the agent. One window is left: open(2) makes the
// name visible in the directory slightly before the creator's open file
// description counts for the lease check, and a lease taken in between
// would let the creator's open proceed on an unlinked file. The minimum
// age closes it (mpichMinAge, judged on the file's modification time,
// which mkstemp sets at the creation). A modification time in the
// future (a clock stepped back, touch -d, cp -p) makes a file young
// until mpichMinAge after the sweep's start, never longer: the end
// sweep waits at most that.
//
// A lease needs the file's ownership (ours: checked) or CAP_LEASE. Where
// leases are refused as such (ENOLCK or EINVAL: fs.leases-enable=0, a
// file system without them), nothing is judged: the sweep stops at the
// first refusal and says so once (errLeasesOff); the files stay.
//
// MPICH's files. MPL's mmap backend (MPICH 4, mpicc.mpich) creates the
// segment with mkstemp on the template /dev/shm/mpich_shar_tmpXXXXXX in
// the host's first rank, sizes it and maps it, and passes its name to
// the host's other ranks, which open and map it; once all have
// attached, the creator unlinks it. A rank killed in that window
// (MPI_Init) leaves the file behind, forever: it is not named after the
// job, so nothing else of gorun's knows it. From its creation on, the
// creator has it open (mkstemp's descriptor, kept until the mmap) or
// mapped (until MPI_Finalize, after the unlink, or its death); the other
// ranks open it by name while the creator still has it mapped.
// (MPL_shm_seg_create_attach_templ in src/mpl/src/shm/mpl_shm_mmap.c:
// mkstemp, lseek and write a byte to size it, mmap, close; callers in
// src/mpid/common/shm: MPIDU_Init_shm_init and shm_alloc create and
// attach at once, broadcast the name, the others attach, a barrier or
// allreduce, then MPL_shm_seg_remove; the segment is detached at
// finalize, after the unlink. The one path that unmaps a file it has not
// unlinked, map_symm_shm's failure, never maps that file again: its
// retry makes a new one.) When mkstemp fails in /dev/shm, MPL falls back
// to /tmp/mpich_shar_tmpXXXXXX: those are not looked for.
//
// The agents' sweeps of /dev/shm (sweepShm: at the start, beside the
// launch; at the end, after the ranks are gone and the job's own files
// are swept; gorun clean) remove them. Open MPI's shared-memory files
// are not covered here: gorun puts them in its own per-job directories
// (ompiDir), swept by their lock.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// mpichShmPrefix begins the names of MPICH's segment files; mkstemp
	// puts six letters or digits after it.
	mpichShmPrefix = "mpich_shar_tmp"
	// mpichMinAge is how old (by modification time) a segment file must
	// be to be judged: far above the length of the open(2) that creates
	// it (see above).
	mpichMinAge = 2 * time.Second
)

// errLeasesOff says that the file system refused a lease as such (not
// because the file is in use): no MPICH file is judged.
var errLeasesOff = errors.New("MPICH's shared-memory files not judged: leases are not available here (fs.leases-enable=0, or a file system without leases)")

// MPICHShmName says whether name is one of MPICH's segment files:
// mpich_shar_tmp and the six characters mkstemp puts there.
func MPICHShmName(name string) bool {
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

// fileID names a file by its device and inode.
type fileID struct{ dev, ino uint64 }

// leaseFunc sets (typ unix.F_WRLCK) or releases (unix.F_UNLCK) a lease
// on the open file fd, as fcntl(F_SETLEASE) does.
type leaseFunc func(fd, typ int) error

// setLease is the kernel's leaseFunc.
func setLease(fd, typ int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, typ)
	return err
}

// mpichSweep is what sweepShm needs to judge MPICH's segment files; its
// zero value judges none.
type mpichSweep struct {
	lease leaseFunc        // nil: MPICH's files are not looked at
	uid   int              // this user
	now   func() time.Time // nil: time.Now
}

// hostMPICHSweep judges MPICH's files with the kernel's leases.
func hostMPICHSweep() mpichSweep {
	return mpichSweep{lease: setLease, uid: os.Getuid()}
}

// on says whether m judges MPICH's files at all.
func (m mpichSweep) on() bool { return m.lease != nil }

// clock is the sweep's time.
func (m mpichSweep) clock() time.Time {
	if m.now != nil {
		return m.now()
	}
	return time.Now()
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
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(dir, name), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(m.uid) {
		return mpichCandidate{}, false
	}
	return mpichCandidate{name: name, id: fileID{st.Dev, st.Ino}, mod: time.Unix(st.Mtim.Unix())}, true
}

// sweep removes (dry: lists) the candidates in dir that are old enough
// at start (taken before dir's names were read) and that nobody else has
// open or mapped. young is when the youngest one kept for its age
// becomes old enough (zero: none was); it is at most start+mpichMinAge.
// With errLeasesOff it stops, having judged nothing.
func (m mpichSweep) sweep(dir string, cands []mpichCandidate, start time.Time, dry bool) (swept []string, young time.Time, err error) {
	if !m.on() {
		return nil, time.Time{}, nil
	}
	var errs []error
	for _, c := range cands {
		// A modification time in the future counts as the start's: the
		// file is young for mpichMinAge from now, not until then.
		if ripe := c.mod; ripe.After(start) {
			young = start.Add(mpichMinAge)
			continue
		} else if ripe = ripe.Add(mpichMinAge); ripe.After(start) {
			if ripe.After(young) {
				young = ripe
			}
			continue
		}
		ok, err := m.remove(dir, c, dry)
		if errors.Is(err, errLeasesOff) {
			return nil, young, err
		}
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			swept = append(swept, c.name)
		}
	}
	return swept, young, errors.Join(errs...)
}

// remove removes (dry: does not) candidate c in dir if nobody else has
// it open or mapped, by the protocol of the file's comment, and says
// whether it did.
func (m mpichSweep) remove(dir string, c mpichCandidate, dry bool) (bool, error) {
	path := filepath.Join(dir, c.name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil // gone, a link now, in another sweep's lease, or not ours to open
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(m.uid) || (fileID{st.Dev, st.Ino}) != c.id {
		return false, nil // not the file judged
	}
	switch err := m.lease(fd, unix.F_WRLCK); {
	case errors.Is(err, unix.EAGAIN):
		return false, nil // open or mapped by someone else
	case errors.Is(err, unix.ENOLCK), errors.Is(err, unix.EINVAL):
		return false, fmt.Errorf("%w: %s: %w", errLeasesOff, path, err)
	case err != nil:
		return false, fmt.Errorf("a lease on %s: %w", path, err)
	}
	defer m.lease(fd, unix.F_UNLCK) //nolint:errcheck // the close releases it too
	// Still the file judged: a new one of the same name (mkstemp picked
	// it again) is not removed.
	if cur, ok := m.candidate(dir, c.name); !ok || cur.id != c.id {
		return false, nil
	}
	if dry {
		return true, nil
	}
	if err := unix.Unlink(path); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("removing %s: %w", path, err)
	}
	return true, nil
}

// UnusedMPICHFiles returns the names of the MPICH segment files in dir
// (a /dev/shm) among those only accepts that the agents' sweep would
// remove now: this user's, old enough, open or mapped by nobody. It
// removes nothing. The chaos suite's leak check judges with it.
func UnusedMPICHFiles(dir string, only func(name string) bool) ([]string, error) {
	m := hostMPICHSweep()
	start := m.clock()
	names, err := readNames(dir)
	if err != nil {
		return nil, err
	}
	var cands []mpichCandidate
	for _, name := range names {
		if !MPICHShmName(name) || !only(name) {
			continue
		}
		if c, ok := m.candidate(dir, name); ok {
			cands = append(cands, c)
		}
	}
	unused, _, err := m.sweep(dir, cands, start, true)
	return unused, err
}
