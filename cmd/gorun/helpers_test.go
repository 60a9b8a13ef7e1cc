package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// The test binary plays the ranks: gorun runs it with GORUNTEST_HELPER set
// (through -x) and TestMain dispatches here before any test runs.
const helperEnv = "GORUNTEST_HELPER"

var helpers = map[string]func() int{
	"env":       helperEnv_,
	"lines":     helperLines,
	"exit":      helperExit,
	"trap":      helperTrap,
	"ignore":    helperIgnore,
	"spawn":     helperSpawn,
	"daemon":    helperDaemon,
	"fence":     helperFence,
	"abuse":     helperSockAbuse,
	"allreduce": helperAllreduce,
	"ring":      helperRing,
	"gpu":       helperGPU,
	"ctlspy":    helperCtlSpy,
}

// helperGPU prints the rank's GPU binding, then sleeps for
// GORUNTEST_SLEEP_MS (while a fake GPU fails).
func helperGPU() int {
	fmt.Printf("gpu CUDA_VISIBLE_DEVICES=%q CUDA_DEVICE_ORDER=%q\n", os.Getenv("CUDA_VISIBLE_DEVICES"), os.Getenv("CUDA_DEVICE_ORDER"))
	time.Sleep(time.Duration(envInt("GORUNTEST_SLEEP_MS")) * time.Millisecond)
	return 0
}

func envInt(name string) int {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: %s=%q: %v\n", name, os.Getenv(name), err)
		os.Exit(99)
	}
	return n
}

// helperEnv_ prints the rank's contract as one JSON line, after making a
// file in its TMPDIR (whose removal the tests check).
func helperEnv_() int {
	m := map[string]string{}
	for _, n := range append(wire.ContractNames, "OMP_NUM_THREADS", "TMPDIR", "GORUNTEST_X", "GORUNTEST_Y") {
		if v, ok := os.LookupEnv(n); ok {
			m[n] = v
		}
	}
	f, err := os.CreateTemp("", "rankfile-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	f.Close()
	m["tmpfile"] = f.Name()
	wd, _ := os.Getwd()
	m["cwd"] = wd
	b, _ := json.Marshal(m)
	fmt.Printf("%s\n", b)
	return 0
}

// helperLines writes lines in fragments, to both streams, so that any
// mid-line interleaving between ranks would show.
func helperLines() int {
	rank := envInt("RANK")
	n := envInt("GORUNTEST_LINES")
	for i := range n {
		line := fmt.Sprintf("rank-%d-line-%d-%s", rank, i, strings.Repeat("x", i%97))
		w := os.Stdout
		if i%5 == 4 {
			w = os.Stderr
		}
		half := len(line) / 2
		w.WriteString(line[:half])
		w.WriteString(line[half:])
		w.WriteString("\n")
	}
	os.Stdout.WriteString("no-newline-at-end-" + strconv.Itoa(rank))
	return 0
}

// helperExit exits with GORUNTEST_CODE on rank GORUNTEST_RANK; the other
// ranks wait to be stopped.
func helperExit() int {
	if envInt("RANK") == envInt("GORUNTEST_RANK") {
		time.Sleep(100 * time.Millisecond)
		return envInt("GORUNTEST_CODE")
	}
	fmt.Println("waiting")
	time.Sleep(time.Hour)
	return 0
}

// helperTrap reports the signals it gets and exits 0 on SIGINT or SIGTERM.
func helperTrap() int {
	c := make(chan os.Signal, 4)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2)
	fmt.Println("job " + os.Getenv("GORUN_JOB_ID"))
	fmt.Println("ready")
	for s := range c {
		fmt.Printf("got %v\n", s)
		if s == syscall.SIGINT || s == syscall.SIGTERM || os.Getenv("GORUNTEST_EXIT_ON_USR") != "" {
			return 0
		}
	}
	return 0
}

// helperIgnore ignores SIGINT and SIGTERM: only SIGKILL ends it.
func helperIgnore() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	fmt.Println("job " + os.Getenv("GORUN_JOB_ID"))
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}

// helperSpawn leaves a child in its process group and sleeps (or exits
// when GORUNTEST_CODE is set), to check that nothing outlives the job.
func helperSpawn() int {
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	fmt.Println("ready")
	if c := os.Getenv("GORUNTEST_CODE"); c != "" {
		n, _ := strconv.Atoi(c)
		return n
	}
	time.Sleep(time.Hour)
	return 0
}

// helperDaemon leaves a grandchild in a session of its own, out of reach
// of its process group, and exits 0.
func helperDaemon() int {
	cmd := exec.Command("sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo started")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	fmt.Print(string(out))
	return 0
}

// helperRing checks that ranks reach each other: every rank listens on
// its host's address, reports it to rank 0 at MASTER_ADDR:MASTER_PORT,
// gets the full list back, and passes a token to the next rank's address.
// Each rank prints the address it got the token from.
func helperRing() int {
	rank, world := envInt("RANK"), envInt("WORLD_SIZE")
	master := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	fail := func(err error) int { fmt.Fprintf(os.Stderr, "ring rank %d: %v\n", rank, err); return 1 }
	deadline := time.Now().Add(30 * time.Second)

	// The address this host is reached at: the local end of a connection to the master.
	var addrs []string
	if rank == 0 {
		l, err := net.Listen("tcp", master)
		if err != nil {
			return fail(err)
		}
		defer l.Close()
		addrs = make([]string, world)
		conns := make([]net.Conn, world)
		ring, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("MASTER_ADDR"), "0"))
		if err != nil {
			return fail(err)
		}
		defer ring.Close()
		addrs[0] = ring.Addr().String()
		for range world - 1 {
			l.(*net.TCPListener).SetDeadline(deadline)
			c, err := l.Accept()
			if err != nil {
				return fail(err)
			}
			var r int
			var a string
			if _, err := fmt.Fscan(c, &r, &a); err != nil {
				return fail(err)
			}
			addrs[r], conns[r] = a, c
		}
		list := strings.Join(addrs, " ")
		for _, c := range conns[1:] {
			fmt.Fprintln(c, list)
			c.Close()
		}
		return passToken(rank, world, ring, addrs, deadline, fail)
	}
	var c net.Conn
	var err error
	for {
		c, err = net.DialTimeout("tcp", master, time.Second)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // rank 0 may not listen yet
	}
	if err != nil {
		return fail(err)
	}
	host, _, _ := net.SplitHostPort(c.LocalAddr().String())
	ring, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fail(err)
	}
	defer ring.Close()
	fmt.Fprintf(c, "%d %s\n", rank, ring.Addr())
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil {
		return fail(err)
	}
	addrs = strings.Fields(line)
	return passToken(rank, world, ring, addrs, deadline, fail)
}

func passToken(rank, world int, ring net.Listener, addrs []string, deadline time.Time, fail func(error) int) int {
	next := addrs[(rank+1)%world]
	errc := make(chan error, 1)
	go func() {
		c, err := net.DialTimeout("tcp", next, 10*time.Second)
		if err == nil {
			_, err = fmt.Fprintf(c, "%d\n", rank)
			c.Close()
		}
		errc <- err
	}()
	ring.(*net.TCPListener).SetDeadline(deadline)
	c, err := ring.Accept()
	if err != nil {
		return fail(err)
	}
	var from int
	if _, err := fmt.Fscan(c, &from); err != nil {
		return fail(err)
	}
	peer, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	c.Close()
	if err := <-errc; err != nil {
		return fail(err)
	}
	self, _, _ := net.SplitHostPort(ring.Addr().String())
	fmt.Printf("token from %d at %s to %s\n", from, peer, self)
	return 0
}

// helperFence talks the rank socket protocol itself: hello, then a fence
// with its own key; it prints the world it was told and every rank's value.
func helperFence() int {
	c, err := net.Dial("unix", os.Getenv("GORUN_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	defer c.Close()
	if err := wire.WriteSock(c, wire.SockHello, &wire.Hello{Version: wire.SockVersion, Pid: os.Getpid()}); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	typ, b, err := wire.ReadSock(c)
	var w wire.Welcome
	if err != nil || typ != wire.SockWelcome || wire.DecodeSock(b, &w) != nil {
		fmt.Fprintf(os.Stderr, "helper: welcome: type %d %v %s\n", typ, err, b)
		return 1
	}
	t, err := wire.DecodeEpochTable(w.Table)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	key := fmt.Sprintf("k%d", w.Rank)
	if err := wire.WriteSock(c, wire.SockFence, &wire.Fence{Epoch: w.Epoch, Seq: 0, KV: map[string]string{key: "v" + os.Getenv("RANK")}}); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	typ, b, err = wire.ReadSock(c)
	var f wire.Fence
	if err != nil || typ != wire.SockFenceDone || wire.DecodeSock(b, &f) != nil || f.Err != "" {
		fmt.Fprintf(os.Stderr, "helper: fence: type %d %v %s\n", typ, err, b)
		return 1
	}
	keys := make([]string, 0, len(f.KV))
	for k, v := range f.KV {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	fmt.Printf("welcome rank=%d world=%d key=%d fence=%s\n", w.Rank, t.World, len(w.DataKey), strings.Join(keys, ","))
	return 0
}

// helperSockAbuse sends the agent malformed frames on fresh connections,
// checks each is refused, then runs the normal fence: the agent survives.
func helperSockAbuse() int {
	path := os.Getenv("GORUN_SOCKET")
	abuse := [][]byte{
		{0xff, 0xff, 0xff, 0xff, 1},               // a 4 GiB frame
		{0, 0, 0, 0, 1},                           // a zero-length frame
		append([]byte{0, 0, 0, 6, 1}, "{bad}"...), // not JSON
		append([]byte{0, 0, 0, 12, 1}, `{"v":99}   `...),
		append([]byte{0, 0, 0, 3, 9}, "{}"...), // unknown type first
	}
	for i, b := range abuse {
		c, err := net.Dial("unix", path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		c.Write(b)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		typ, _, err := wire.ReadSock(c)
		c.Close()
		if err == nil && typ != wire.SockError {
			fmt.Fprintf(os.Stderr, "helper: abuse %d answered with type %d\n", i, typ)
			return 1
		}
	}
	return helperFence()
}
