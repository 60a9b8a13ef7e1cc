package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// slurmDirInfix names a Slurm cluster's directory: TAG + slurmDirInfix +
// random, in os.TempDir(), so that the tag (and its owner's pid) of a
// killed test's cluster can be read back.
const slurmDirInfix = "-slurm-"

// slurmDirTag returns the tag of a Slurm cluster directory (its path),
// and whether it is one.
func slurmDirTag(dir string) (string, int, bool) {
	if filepath.Dir(dir) != filepath.Clean(os.TempDir()) {
		return "", 0, false
	}
	base := filepath.Base(dir)
	tag, pid, ok := tagOf(base)
	if !ok || !strings.HasPrefix(base[len(tag):], slurmDirInfix) {
		return "", 0, false
	}
	return tag, pid, true
}

// slurmConfTag returns the tag of the Slurm cluster whose slurm.conf a
// process's environment (/proc/PID/environ) names in SLURM_CONF.
func slurmConfTag(environ []byte) (string, int, bool) {
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		if conf, ok := bytes.CutPrefix(kv, []byte("SLURM_CONF=")); ok {
			return slurmDirTag(filepath.Dir(string(conf)))
		}
	}
	return "", 0, false
}

// cleanupStaleSlurm kills the processes of Slurm clusters whose test is
// gone (munged, slurmctld, slurmd, salloc, ...: every process whose
// SLURM_CONF is in such a cluster's directory; StartSlurm gives its
// daemons that environment) and removes those directories.
func cleanupStaleSlurm() error {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("testcluster: %w", err)
	}
	var errs []error
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := killStaleSlurm(pid); err != nil {
			errs = append(errs, err)
		}
	}
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"+slurmDirInfix+"*"))
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, dir := range dirs {
		if tag, pid, ok := slurmDirTag(dir); ok && stale(tag, pid) {
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, fmt.Errorf("testcluster: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// killStaleSlurm sends SIGKILL to pid if it is a process of a stale Slurm
// cluster. The process is opened (a pidfd) before its environment is read,
// so a pid reused meanwhile is not hit.
func killStaleSlurm(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	defer p.Release()
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil // gone, or a kernel thread
	}
	tag, owner, ok := slurmConfTag(environ)
	if !ok || !stale(tag, owner) {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("testcluster: killing pid %d of stale Slurm cluster %s: %w", pid, tag, err)
	}
	return nil
}
