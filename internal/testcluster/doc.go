// Package testcluster runs "hosts" for multi-host end-to-end tests on one
// machine: each host is a Linux network namespace joined by a veth pair to a
// bridge in the root namespace, with its own IPv4 address (DESIGN.md §8).
//
//	h := testcluster.NetnsHosts(t, 4)          // skips unless root with iproute2
//	hostfile := h.WriteHostfile(t, t.TempDir(), 2)
//	// the launcher binds its control plane on h.BridgeAddr and starts agents
//	// with --rsh "ip netns exec"; h.Names are the hostfile's host names.
//	h.LinkDown(1) // partition host 1: its processes keep running
//	h.KillAll(2)  // crash host 2: every process in it gets SIGKILL
//
// # Network
//
// Each call to [NetnsHosts] takes a free /24 in 10.77.0.0/16. The bridge has
// .1 ([Hosts.BridgeAddr]) and host i has .(i+2). Inside a host, eth0 carries
// that address, lo is up (127.0.0.1 is the host's own), and the default route
// points at the bridge address. The bridge has IPv4 forwarding switched off
// (per interface, /proc/sys/net/ipv4/conf/BRIDGE/forwarding), so nothing a
// host sends is routed beyond the bridge, whatever the machine's global
// ip_forward says; there is no NAT. Host-to-host traffic is bridged. IPv6
// address generation is off on every link the package creates.
//
// Linux delivers a packet addressed to any of the root namespace's own
// addresses whichever interface it arrives on, so a host can reach root
// listeners bound to 0.0.0.0; bind test servers to [Hosts.BridgeAddr].
//
// # Names and leftovers
//
// Every object is named from a tag "grt" + pid (5 base-36 digits) + a
// per-process counter (2 base-36 digits): namespaces TAG-hI, the bridge
// TAG-br, root-side veths TAG-vI (at most 14 bytes, within IFNAMSIZ). A test
// process that died without cleaning up leaves objects whose pid is dead;
// [CleanupStale] removes them, and [NetnsHosts] calls it first. Pids are
// compared within the caller's pid namespace.
//
// # Skipping
//
// [NetnsHosts] skips the test when not running as root, when no ip binary is
// found, or when "ip netns" does not work. Set GORUN_TESTCLUSTER_REQUIRE=1
// (CI does not need to: it runs as root) to turn those skips into failures.
// Once the checks pass, any setup error fails the test.
package testcluster
