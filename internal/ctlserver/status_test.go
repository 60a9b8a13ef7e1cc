package ctlserver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// statusJob is a control plane with a status user and no remote host: it
// listens (on loopback) for the status client alone.
func statusJob(t *testing.T) (*testJob, nkeys.KeyPair) {
	t.Helper()
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	srv, err := ctlserver.Start(ctlserver.Config{Job: job, LocalPassword: secret.InProcessPassword(), StatusNkey: pub,
		Hosts: []ctlserver.HostUser{{Password: "local-host-password"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	if srv.URL() == "" {
		t.Fatal("a server with a status user does not listen")
	}
	l, err := control.DialInProcess(t.Context(), srv.InProcess(), secret, control.ControlOptions{Name: "launcher"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return &testJob{secret: secret, srv: srv, launcher: l}, kp
}

func statusConn(t *testing.T, url string, kp nkeys.KeyPair, errs chan error) *nats.Conn {
	t.Helper()
	pub, _ := kp.PublicKey()
	nc, err := nats.Connect(url, nats.Nkey(pub, kp.Sign), nats.NoReconnect(), nats.CustomInboxPrefix(wire.JobSubjects(job).StatusInbox()),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestStatusUserRequestOnly: the status credential may send the status
// request and read its answer; every other publish is dropped by the
// server (the launcher, subscribed to everything, sees only the status
// request), every other subscription is a permission violation.
func TestStatusUserRequestOnly(t *testing.T) {
	j, kp := statusJob(t)
	s := wire.JobSubjects(job)
	all := seeAll(t, j.launcher.Conn)
	errs := make(chan error, 64)
	nc := statusConn(t, j.url(t), kp, errs)
	h0 := s.ForHost(0)
	forbidden := []string{s.Control, s.Epoch, s.G, s.Fence, s.StdinTo(0), s.OutputAck(0), h0.Heartbeat, h0.Events, h0.Register,
		h0.Inbox + ".x", s.StatusInbox() + ".x", wire.JobSubjects("otherjob").Status(), "anything"}
	for _, f := range forbidden {
		if err := nc.Publish(f, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Publish(s.Status(), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-all:
		if m.Subject != s.Status() {
			t.Fatalf("the launcher received %q on %s (a forbidden publish got through)", m.Data, m.Subject)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the status request never came")
	}

	// Subscriptions: only under the status inbox.
	for _, subj := range []string{s.Control, s.G, s.Up, s.Status(), h0.Inbox + ".>", "_INBOX.>", ">", s.StatusInbox() + ".abc"} {
		ok := strings.HasPrefix(subj, s.StatusInbox()+".")
		t.Run("subscribe "+subj, func(t *testing.T) {
			errs := make(chan error, 4)
			nc := statusConn(t, j.url(t), kp, errs)
			if _, err := nc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if ok {
				select {
				case err := <-errs:
					t.Errorf("subscribing to %s: %v", subj, err)
				default:
				}
				return
			}
			select {
			case err := <-errs:
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Errorf("subscribing to %s: %v, want a permission violation", subj, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("subscribing to %s: no permission violation", subj)
			}
		})
	}

	// A request and its answer go through.
	if _, err := j.launcher.Subscribe(s.Status(), func(m *nats.Msg) { _ = j.launcher.Publish(m.Reply, []byte("snapshot")) }); err != nil {
		t.Fatal(err)
	}
	if err := j.launcher.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, s.Status(), nil)
	if err != nil || string(m.Data) != "snapshot" {
		t.Fatalf("status request: %v, %v", m, err)
	}
}

// TestStatusWrongCredential: another nkey, a host's key, and the launcher's
// password are refused as status clients.
func TestStatusWrongCredential(t *testing.T) {
	j, _ := statusJob(t)
	other, _ := nkeys.CreateUser()
	c0 := j.secret.HostCredentials(0, nil)
	hostKP, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, c0.Control[:])
	if err != nil {
		t.Fatal(err)
	}
	for name, kp := range map[string]nkeys.KeyPair{"another nkey": other, "host 0's key": hostKP} {
		t.Run(name, func(t *testing.T) {
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
	nc, err := nats.Connect(j.url(t), nats.NoReconnect())
	if err == nil {
		nc.Close()
		t.Fatal("a client without credential was admitted")
	}
}
