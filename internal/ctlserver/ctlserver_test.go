package ctlserver_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

const job = "permjob"

// testJob is a control plane for job with hosts remote hosts, and the
// launcher's in-process connection to it.
type testJob struct {
	secret   jobkey.Secret
	srv      *ctlserver.Server
	launcher *control.Control
}

func startJob(t *testing.T, bind string, hosts int) *testJob {
	t.Helper()
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	cfg := ctlserver.Config{Job: job, Bind: bind, LocalPassword: secret.InProcessPassword(), Hosts: make([]ctlserver.HostUser, hosts)}
	for i := range hosts {
		if cfg.Hosts[i].Nkey, err = control.PublicKey(secret.HostCredentials(i, nil)); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := ctlserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	l, err := control.DialInProcess(t.Context(), srv.InProcess(), secret, control.ControlOptions{Name: "launcher"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return &testJob{secret: secret, srv: srv, launcher: l}
}

// url is where a client on this machine reaches the server.
func (j *testJob) url(t *testing.T) string {
	t.Helper()
	u := j.srv.URL()
	if u == "" {
		t.Fatal("the server does not listen")
	}
	return strings.Replace(u, "0.0.0.0", "127.0.0.1", 1)
}

// host connects as host's agent, as internal/agent does, logging to log
// (if not nil).
func (j *testJob) host(t *testing.T, host int, log *slog.Logger) *control.Control {
	t.Helper()
	c, err := control.DialControl(t.Context(), j.url(t), j.secret.HostCredentials(host, j.srv.Fingerprint()),
		control.ControlOptions{Name: "agent", InboxPrefix: wire.JobSubjects(job).ForHost(host).Inbox, DialTimeout: 5 * time.Second, Logger: log})
	if err != nil {
		t.Fatalf("host %d: %v", host, err)
	}
	t.Cleanup(c.Close)
	return c
}

// seeAll subscribes nc to every subject of the server (the launcher's view
// of what reaches the job), flushed so that nothing published after it
// returns is missed; the subscription ends with the test.
func seeAll(t *testing.T, nc *nats.Conn) chan *nats.Msg {
	t.Helper()
	all := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(">", all)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return all
}

// TestHostCannotPublishForOthers: an agent's credential cannot publish
// control (kill, restart, epochs, G, fences, another host's stdin) nor on
// another host's subjects. The server drops the message: a subscriber of
// everything, which sees the host's own messages in the order they were
// sent, never sees it.
func TestHostCannotPublishForOthers(t *testing.T) {
	j := startJob(t, "", 2)
	all := seeAll(t, j.launcher.Conn)
	var logs gortest.SyncBuffer
	h0 := j.host(t, 0, slog.New(slog.NewTextHandler(&logs, nil)))
	s, mine, other := wire.JobSubjects(job), wire.JobSubjects(job).ForHost(0), wire.JobSubjects(job).ForHost(1)
	kill := wire.Marshal(&wire.Control{Op: wire.OpKill})
	forbidden := []struct {
		name, subject string
		data          []byte
	}{
		{"kill", s.Control, kill},
		{"restart", s.Control, wire.Marshal(&wire.Control{Op: wire.OpRestart})},
		{"epoch", s.Epoch, []byte("table")},
		{"G", s.G, wire.Marshal(&wire.GlobalStep{G: 1 << 40})},
		{"merged fence", s.Fence, []byte("{}")},
		{"another host's stdin", s.StdinTo(1), []byte("x")},
		{"own stdin", s.StdinTo(0), []byte("x")},
		{"another host's heartbeat", other.Heartbeat, wire.Marshal(&wire.Heartbeat{Host: 1})},
		{"another host's events", other.Events, []byte("{}")},
		{"another host's output", other.Output, []byte("O")},
		{"another host's fence", other.UpFence, []byte("{}")},
		{"another host's progress", other.Progress, []byte("{}")},
		{"another host's registration", other.Register, []byte("{}")},
		{"another host's inbox", other.Inbox + ".x.y", []byte("{}")},
		{"the launcher's wildcard", "gorun." + job + ".up", []byte("{}")},
		{"another job", wire.JobSubjects("otherjob").Control, kill},
		{"outside gorun", "anything", []byte("x")},
	}
	for _, f := range forbidden {
		if err := h0.Publish(f.subject, f.data); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	}
	// The host's own subjects get through, after everything above.
	allowed := []string{mine.Events, mine.Output, mine.UpFence, mine.Progress, mine.Heartbeat}
	for _, a := range allowed {
		if err := h0.Publish(a, []byte("mine")); err != nil {
			t.Fatal(err)
		}
	}
	if err := h0.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, want := range allowed {
		select {
		case m := <-all:
			if m.Subject != want {
				t.Fatalf("the launcher received %q on %s (a forbidden publish got through)", m.Data, m.Subject)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the host's own message %d on %s never came", i, want)
		}
	}
	// The agent hears of the refusals (the server sends them before the
	// PONG of the flush; the handler runs on its own goroutine).
	for deadline := time.Now().Add(30 * time.Second); strings.Count(logs.String(), "control plane refused") < len(forbidden); {
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals logged, want %d:\n%s", strings.Count(logs.String(), "control plane refused"), len(forbidden), logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHostSubscriptions: an agent's credential may subscribe only to what
// the launcher sends agents, its own stdin and its own inbox.
func TestHostSubscriptions(t *testing.T) {
	j := startJob(t, "", 2)
	creds := j.secret.HostCredentials(0, nil)
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, creds.Control[:])
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	s, mine, other := wire.JobSubjects(job), wire.JobSubjects(job).ForHost(0), wire.JobSubjects(job).ForHost(1)
	tests := []struct {
		subject string
		ok      bool
	}{
		{s.Control, true}, {s.Epoch, true}, {s.Fence, true}, {s.G, true},
		{s.StdinTo(0), true}, {mine.Inbox + ".abc.*", true},
		{s.StdinTo(1), false}, {other.Inbox + ".>", false}, {"_INBOX.>", false},
		{s.Up, false}, {other.Heartbeat, false}, {mine.Heartbeat, false},
		{s.Register, false}, {">", false},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			errs := make(chan error, 4)
			nc, err := nats.Connect(j.url(t), nats.Nkey(pub, kp.Sign), nats.NoReconnect(),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			sub, err := nc.SubscribeSync(tt.subject)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if !tt.ok {
				select {
				case err := <-errs:
					if !errors.Is(err, nats.ErrPermissionViolation) {
						t.Errorf("subscribing to %s: %v, want a permission violation", tt.subject, err)
					}
				case <-time.After(30 * time.Second):
					t.Errorf("subscribing to %s: no permission violation", tt.subject)
				}
				return
			}
			// An allowed subscription receives what the launcher sends.
			subject := strings.ReplaceAll(tt.subject, "*", "x")
			if err := j.launcher.Publish(subject, []byte("hi")); err != nil {
				t.Fatal(err)
			}
			if _, err := sub.NextMsg(30 * time.Second); err != nil {
				t.Errorf("subscribed to %s: %v", tt.subject, err)
			}
			select {
			case err := <-errs:
				t.Errorf("subscribing to %s: %v", tt.subject, err)
			default:
			}
		})
	}
}

// TestHostAnswersStdinOnce: the agent may answer the launcher's stdin
// request (on the launcher's inbox, which it may not otherwise publish to).
func TestHostAnswersStdinOnce(t *testing.T) {
	j := startJob(t, "", 1)
	h0 := j.host(t, 0, nil)
	s := wire.JobSubjects(job)
	if _, err := h0.Subscribe(s.StdinTo(0), func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	if err := h0.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := j.launcher.RequestWithContext(ctx, s.StdinTo(0), []byte("data"))
	if err != nil || string(m.Data) != "ok" {
		t.Fatalf("stdin request: %v, %v", m, err)
	}
}

// TestRankKeyIsNotAControlCredential: the data-plane key (all a rank
// receives) and the replica-link key, used as an nkey seed, are refused
// with an authorization error; so is host 0's key presented as host 1's.
func TestRankKeyIsNotAControlCredential(t *testing.T) {
	j := startJob(t, "", 2)
	c0 := j.secret.HostCredentials(0, nil)
	for name, k := range map[string]jobkey.Key{"data-plane key": c0.Data, "link key": c0.Link, "a random key": randomKey(t)} {
		t.Run(name, func(t *testing.T) {
			kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, k[:])
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := kp.PublicKey()
			nc, err := nats.Connect(j.url(t), nats.Nkey(pub, kp.Sign), nats.NoReconnect())
			if err == nil {
				nc.Close()
				t.Fatal("admitted")
			}
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("refused with %v, want an authorization error", err)
			}
		})
	}
	// The launcher's password is good for in-process connections only.
	nc, err := nats.Connect(j.url(t), nats.UserInfo(wire.InProcessUser, j.secret.InProcessPassword()), nats.NoReconnect())
	if err == nil {
		nc.Close()
		t.Fatal("the launcher's in-process password was accepted over TCP")
	}
}

func randomKey(t *testing.T) jobkey.Key {
	var k jobkey.Key
	rand.Read(k[:])
	return k
}

// TestTLS: a server listening on anything but loopback speaks only TLS,
// with a certificate the agents pin. An agent refuses a server with
// another certificate (a man in the middle, or another job's server), and
// the server refuses a plaintext client.
func TestTLS(t *testing.T) {
	j := startJob(t, "0.0.0.0", 1)
	pin := j.srv.Fingerprint()
	if len(pin) != 32 {
		t.Fatalf("a non-loopback listener has no certificate fingerprint (%d bytes)", len(pin))
	}
	if lo := startJob(t, "127.0.0.1", 1); lo.srv.Fingerprint() != nil {
		t.Error("a loopback listener uses TLS")
	}
	mitm := startJob(t, "0.0.0.0", 1) // a server with its own certificate
	creds := j.secret.HostCredentials(0, pin)
	dial := func(url string, c jobkey.HostCredentials) error {
		ctl, err := control.DialControl(t.Context(), url, c, control.ControlOptions{DialTimeout: 5 * time.Second})
		if err == nil {
			ctl.Close()
		}
		return err
	}
	if err := dial(j.url(t), creds); err != nil {
		t.Fatalf("the pinned server refused: %v", err)
	}
	other := randomKey(t)
	wrong := j.secret.HostCredentials(0, other[:])
	if err := dial(j.url(t), wrong); !errors.Is(err, control.ErrCertificatePin) {
		t.Errorf("with a wrong pin: %v, want ErrCertificatePin", err)
	}
	// The man in the middle admits host 0 of the real job (the agent's
	// credential would work there): only the pin stops the agent.
	if err := dial(mitm.url(t), mitm.secret.HostCredentials(0, pin)); !errors.Is(err, control.ErrCertificatePin) {
		t.Errorf("a server with another certificate: %v, want ErrCertificatePin", err)
	}
	// A plaintext client, even with the right key, is refused.
	plain := strings.Replace(j.url(t), "tls://", "nats://", 1)
	if err := dial(plain, j.secret.HostCredentials(0, nil)); err == nil {
		t.Error("a plaintext client was admitted")
	}
	plaintextRefused(t, j.url(t))
}

// TestTLSOnWildcard: a server on the wildcard is reached at each of its
// addresses (URLAt), with the one pinned certificate, which names them
// all.
func TestTLSOnWildcard(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	creds := secret.HostCredentials(0, nil)
	cfg := ctlserver.Config{Job: job, Bind: "0.0.0.0", Addrs: addrs, LocalPassword: secret.InProcessPassword(), Hosts: make([]ctlserver.HostUser, 1)}
	if cfg.Hosts[0].Nkey, err = control.PublicKey(creds); err != nil {
		t.Fatal(err)
	}
	srv, err := ctlserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	for _, a := range addrs {
		url := srv.URLAt(a)
		if !strings.HasPrefix(url, "tls://"+a.String()+":") {
			t.Fatalf("URLAt(%v) = %q", a, url)
		}
		ctl, err := control.DialControl(t.Context(), url, secret.HostCredentials(0, srv.Fingerprint()), control.ControlOptions{DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("at %s: %v", url, err)
		}
		ctl.Close()
	}
	// One srun gives every agent the same --control: on the wildcard, the
	// server at each address, comma-separated (launcher.srunControlURL).
	// An agent connects through whichever it can reach: here the first is
	// a closed port, tried first or second at random, a few times over.
	closed, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "tls://" + closed.Addr().String()
	closed.Close()
	for range 4 {
		ctl, err := control.DialControl(t.Context(), dead+","+srv.URLAt(addrs[1]), secret.HostCredentials(0, srv.Fingerprint()), control.ControlOptions{DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("through the list %s,%s: %v", dead, srv.URLAt(addrs[1]), err)
		}
		ctl.Close()
	}
	// The certificate, as a client sees it after the server's INFO.
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.URLAt(addrs[1]), "tls://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for _, ip := range tc.ConnectionState().PeerCertificates[0].IPAddresses {
		a, _ := netip.AddrFromSlice(ip)
		got = append(got, a.Unmap())
	}
	if !slices.Equal(got, addrs) {
		t.Errorf("the certificate names %v, want %v", got, addrs)
	}
}

// plaintextRefused speaks the NATS protocol in plaintext at url: the
// server must not answer a PING.
func plaintextRefused(t *testing.T, url string) {
	t.Helper()
	addr := url[strings.Index(url, "://")+3:]
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	info, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, `"tls_required":true`) {
		t.Errorf("INFO does not require TLS: %s", info)
	}
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false}\r\nPING\r\n")); err != nil {
		return // closed already
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return // closed: refused
		}
		if strings.HasPrefix(line, "PONG") {
			t.Fatal("the server answered a plaintext client")
		}
	}
}

// TestHostDisconnected: the server tells which host's agent lost its
// connection, for agents over TCP (nkey) and in process (password) alike,
// and says nothing of the launcher's own connection.
func TestHostDisconnected(t *testing.T) {
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	type drop struct {
		host   int
		reason string
	}
	drops := make(chan drop, 8)
	cfg := ctlserver.Config{Job: job, LocalPassword: secret.InProcessPassword(), Hosts: make([]ctlserver.HostUser, 2),
		HostDisconnected: func(h int, reason string) { drops <- drop{h, reason} }}
	if cfg.Hosts[0].Nkey, err = control.PublicKey(secret.HostCredentials(0, nil)); err != nil {
		t.Fatal(err)
	}
	cfg.Hosts[1].Password = secret.HostCredentials(1, nil).InProcessPassword()
	srv, err := ctlserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	j := &testJob{secret: secret, srv: srv}

	launcher, err := control.DialInProcess(t.Context(), srv.InProcess(), secret, control.ControlOptions{Name: "launcher"})
	if err != nil {
		t.Fatal(err)
	}
	launcher.Close()
	remote := j.host(t, 0, nil)
	local, err := control.DialInProcessHost(t.Context(), srv.InProcess(), secret.HostCredentials(1, nil), control.ControlOptions{Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		host int
		c    *control.Control
	}{{1, local}, {0, remote}} {
		tt.c.Close()
		select {
		case d := <-drops:
			if d.host != tt.host || d.reason == "" {
				t.Errorf("disconnect of host %d (%q), want host %d with a reason", d.host, d.reason, tt.host)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no disconnect reported for host %d", tt.host)
		}
	}
	select {
	case d := <-drops:
		t.Errorf("a further disconnect reported: %+v (the launcher's?)", d)
	default:
	}
}
