package testcluster

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockTimeout bounds the wait for the machine-wide subnet lock.
const lockTimeout = 30 * time.Second

// lockPath is the file whose flock serializes subnet choice among all
// processes on the machine using this package.
func lockPath() string {
	dir := "/run"
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "gorun-testcluster.lock")
}

// lockSubnets takes the machine-wide subnet lock and returns its release.
// flock locks belong to the open file, so goroutines of one process exclude
// each other as well as other processes; a crashed holder releases it.
func lockSubnets() (unlock func(), err error) {
	f, err := os.OpenFile(lockPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("testcluster: subnet lock: %w", err)
	}
	deadline := time.Now().Add(lockTimeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("testcluster: subnet lock %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("testcluster: subnet lock %s: still held by another process after %v", f.Name(), lockTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// subnet returns 10.77.x.0/24.
func subnet(x int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, byte(x), 0}), 24)
}

// hostAddr returns the address .(last) in 10.77.x.0/24.
func hostAddr(x, last int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 77, byte(x), byte(last)})
}

// subnetInUse reports whether the root namespace already has an address in
// sub, or a route to sub or part of it, on a device other than except.
func subnetInUse(sub netip.Prefix, except string) (bool, error) {
	addrs, err := listAddrs()
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if a.dev != except && sub.Contains(a.addr) {
			return true, nil
		}
	}
	routes, err := listRoutes()
	if err != nil {
		return false, err
	}
	for _, r := range routes {
		// Less specific routes (10.0.0.0/8 via a VPN, say) lose to the
		// bridge's /24 and do not matter; equal or more specific ones do.
		if r.dev != except && r.dst.Bits() >= sub.Bits() && r.dst.Overlaps(sub) {
			return true, nil
		}
	}
	return false, nil
}

// assignSubnet gives bridge br the address .1 of a free 10.77.x.0/24,
// starting the search at a point derived from pid and ctr, and returns x.
// The choice is made under the machine-wide lock; if an address in the
// chosen subnet still shows up on another device afterwards (someone not
// taking the lock), the address is removed and the next subnet tried.
func assignSubnet(br string, pid, ctr int) (int, error) {
	unlock, err := lockSubnets()
	if err != nil {
		return 0, err
	}
	defer unlock()
	start := int((uint32(pid)*2654435761 + uint32(ctr)*40503) % 254)
	for i := range 254 {
		x := (start+i)%254 + 1 // 1..254
		sub := subnet(x)
		if used, err := subnetInUse(sub, ""); err != nil {
			return 0, err
		} else if used {
			continue
		}
		cidr := netip.PrefixFrom(hostAddr(x, 1), 24).String()
		if _, err := ip("addr", "add", cidr, "dev", br); err != nil {
			return 0, err
		}
		used, err := subnetInUse(sub, br)
		if err != nil {
			return 0, err
		}
		if !used {
			return x, nil
		}
		if _, err := ip("addr", "del", cidr, "dev", br); err != nil {
			return 0, err
		}
	}
	return 0, errors.New("testcluster: no free /24 left in 10.77.0.0/16")
}
