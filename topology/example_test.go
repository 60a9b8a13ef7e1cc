package topology_test

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/topology"
)

func ExampleParseHostfile() {
	const hostfile = `
# two racks and a spare
node1 slots=2 rack=r1
node2:2 rack=r2
node3 spare
`
	hosts, err := topology.ParseHostfile(strings.NewReader(hostfile), "hosts")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, h := range hosts {
		fmt.Println(h.Name, h.Slots, h.Rack, h.Spare, h.Source)
	}
	_, err = topology.ParseHostfile(strings.NewReader("node1 slots=2\nnode2 cores=4\n"), "hosts")
	fmt.Println(err)
	// Output:
	// node1 2 r1 false hosts:3
	// node2 2 r2 false hosts:4
	// node3 1  true hosts:5
	// hostfile hosts:2: unknown key "cores"
}

func ExampleExpandNodeList() {
	names, err := topology.ExpandNodeList("node[01-03,07],gpu[1-2]x,login")
	fmt.Println(names, err)
	// Output: [node01 node02 node03 node07 gpu1x gpu2x login] <nil>
}

func ExampleMapRanks() {
	hosts, _ := topology.ParseHostList("a:2,b:2")
	for _, by := range []topology.MapBy{topology.MapBySlot, topology.MapByNode} {
		as, _ := topology.MapRanks(hosts, topology.MapOptions{NP: 4, By: by})
		fmt.Print(by, ":")
		for _, a := range as {
			fmt.Printf(" %d@%s/%d", a.Rank, hosts[a.Host].Name, a.LocalRank)
		}
		fmt.Println()
	}
	_, err := topology.MapRanks(hosts, topology.MapOptions{NP: 5})
	fmt.Println(err)
	// Output:
	// slot: 0@a/0 1@a/1 2@b/0 3@b/1
	// node: 0@a/0 1@b/0 2@a/1 3@b/1
	// topology: too many ranks: 5 ranks requested but only 4 slots on 2 hosts; use --oversubscribe or add hosts
}
