package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Object names: tag = prefix + pid (pidDigits base-36 digits) + counter
// (ctrDigits base-36 digits). Namespaces are tag+"-h"+i, the bridge
// tag+"-br", root-side veths tag+"-v"+base36(i).
const (
	prefix    = "grt"
	pidDigits = 5 // 36^5 > 2^22, the largest pid_max
	ctrDigits = 2
	ctrMod    = 36 * 36
	tagLen    = len(prefix) + pidDigits + ctrDigits
)

func makeTag(pid, ctr int) string {
	return prefix + pad36(pid, pidDigits) + pad36(ctr%ctrMod, ctrDigits)
}

func pad36(v, width int) string {
	s := strconv.FormatInt(int64(v), 36)
	if len(s) < width {
		s = strings.Repeat("0", width-len(s)) + s
	}
	return s
}

func nsName(tag string, i int) string   { return tag + "-h" + strconv.Itoa(i) }
func bridgeName(tag string) string      { return tag + "-br" }
func vethName(tag string, i int) string { return tag + "-v" + strconv.FormatInt(int64(i), 36) }
func ownedBy(name, tag string) bool     { return strings.HasPrefix(name, tag+"-") }
func isVeth(name, tag string) bool      { return strings.HasPrefix(name, tag+"-v") }

func isLowerAlnum(s string) bool {
	return strings.Trim(s, "0123456789abcdefghijklmnopqrstuvwxyz") == ""
}

// tagOf parses an object name made by this package into its tag and the
// owning pid; ok is false for names of anything else.
func tagOf(name string) (tag string, pid int, ok bool) {
	if len(name) <= tagLen || !strings.HasPrefix(name, prefix) || name[tagLen] != '-' {
		return "", 0, false
	}
	if !isLowerAlnum(name[len(prefix):tagLen]) {
		return "", 0, false
	}
	p, err := strconv.ParseInt(name[len(prefix):len(prefix)+pidDigits], 36, 64)
	if err != nil {
		return "", 0, false
	}
	return name[:tagLen], int(p), true
}

// live holds the tags this process has handed out and not yet torn down.
var live struct {
	mu   sync.Mutex // guards the fields below
	tags map[string]bool
	next int
}

// newTag reserves a tag for this process that no live cluster of it uses.
func newTag() (string, error) {
	live.mu.Lock()
	defer live.mu.Unlock()
	if live.tags == nil {
		live.tags = make(map[string]bool)
	}
	for range ctrMod {
		tag := makeTag(os.Getpid(), live.next)
		live.next = (live.next + 1) % ctrMod
		if !live.tags[tag] {
			live.tags[tag] = true
			return tag, nil
		}
	}
	return "", fmt.Errorf("testcluster: all %d clusters of this process are in use", ctrMod)
}

func releaseTag(tag string) {
	live.mu.Lock()
	defer live.mu.Unlock()
	delete(live.tags, tag)
}

func isLive(tag string) bool {
	live.mu.Lock()
	defer live.mu.Unlock()
	return live.tags[tag]
}

// pidAlive reports whether a process with pid exists in our pid namespace
// and is not a zombie: a test binary killed by a signal may stay a zombie
// for a while when nobody reaps it, and its leftovers are stale all the same.
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')', comm may hold any byte.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		switch stat[i+2] {
		case 'Z', 'X':
			return false
		}
	}
	return true
}

// stale reports whether the objects of a tag owned by pid are leftovers: the
// owner is dead, or it is this process and the tag is not one of its live
// clusters (an earlier process with our pid crashed).
func stale(tag string, pid int) bool {
	if pid == os.Getpid() {
		return !isLive(tag)
	}
	return !pidAlive(pid)
}

// CleanupStale removes the namespaces, veths and bridges left behind by
// test processes that died without cleaning up: those named with this
// package's prefix whose owning pid (encoded in the name) is dead, or is
// this process's pid but not one of its live clusters (pid reuse after a
// crash). Processes still running in those namespaces are killed first,
// and so are the processes of such a test's Slurm cluster (StartSlurm),
// whose directory is removed.
// Objects of live processes are left alone. It is safe to call
// concurrently, also from several processes. [NetnsHosts] calls it.
func CleanupStale() error {
	nss, err := listNetns()
	if err != nil {
		return err
	}
	links, err := listLinks()
	if err != nil {
		return err
	}
	var tags []string
	for _, name := range slices.Concat(nss, links) {
		if tag, pid, ok := tagOf(name); ok && !slices.Contains(tags, tag) && stale(tag, pid) {
			tags = append(tags, tag)
		}
	}
	// The Slurm daemons first: some run in the root namespace.
	errs := []error{cleanupStaleSlurm()}
	for _, tag := range tags {
		errs = append(errs, removeCluster(tag))
	}
	return errors.Join(errs...)
}

// removeCluster kills every process in the namespaces of tag, then deletes
// the namespaces, the veths and the bridge. Objects that are already gone
// (or vanish meanwhile, e.g. under a concurrent CleanupStale) are not errors.
func removeCluster(tag string) error {
	nss, err := listNetns()
	if err != nil {
		return err
	}
	nss = slices.DeleteFunc(nss, func(n string) bool { return !ownedBy(n, tag) })
	var errs []error
	for _, ns := range nss {
		if err := killNetns(ns); err != nil && !errors.Is(err, errNoNetns) {
			errs = append(errs, err)
		}
	}
	for _, ns := range nss {
		if _, err := ip("netns", "del", ns); err != nil && present(listNetns, ns) {
			errs = append(errs, err)
		}
	}
	links, err := listLinks()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	links = slices.DeleteFunc(links, func(n string) bool { return !ownedBy(n, tag) })
	// Veths before the bridge they are enslaved to.
	slices.SortStableFunc(links, func(a, b string) int {
		switch va, vb := isVeth(a, tag), isVeth(b, tag); {
		case va && !vb:
			return -1
		case vb && !va:
			return 1
		}
		return 0
	})
	for _, l := range links {
		if _, err := ip("link", "del", "dev", l); err != nil && present(listLinks, l) {
			errs = append(errs, err)
		}
	}
	if err := leftovers(tag); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// leftovers reports an error naming whatever of tag still exists.
func leftovers(tag string) error {
	var left []string
	for _, list := range []func() ([]string, error){listNetns, listLinks} {
		names, err := list()
		if err != nil {
			return err
		}
		for _, n := range names {
			if ownedBy(n, tag) {
				left = append(left, n)
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("testcluster: %s still present after removal: %s", tag, strings.Join(left, ", "))
	}
	return nil
}

// present reports whether name is in list's result; a failed listing counts
// as present, so that the delete error it is asked about gets reported.
func present(list func() ([]string, error), name string) bool {
	names, err := list()
	return err != nil || slices.Contains(names, name)
}
