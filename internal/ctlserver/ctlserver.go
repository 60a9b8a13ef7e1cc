// Package ctlserver runs a job's embedded control-plane server, a NATS
// server. It is the only package of gorun that imports nats-server.
//
// # Trust
//
// The server admits nobody without a credential, and every credential is
// one principal's (internal/jobkey/secret.go derives them from the job secret):
//
//   - the launcher, on an in-process connection only, with a password
//     (Config.LocalPassword): it may publish and subscribe anywhere;
//
//   - the agent of host i, one user per host (Config.Hosts[i]): by nkey
//     signature over TCP when the agent is remote, by password on an
//     in-process connection when it runs inside the launcher. Either way
//     the user may publish only on host i's own subjects, answer requests
//     it received, and subscribe only to what the launcher sends agents,
//     host i's stdin and output acks, and host i's inbox
//     (wire.Subjects.HostPermissions).
//     A host cannot publish control (kill, restart, epochs, G) nor speak
//     for another host; the server drops such messages (a permission
//     violation), so no subscriber ever sees them.
//
//   - status clients (gorun status), by the status nkey
//     (Config.StatusNkey) over TCP: they may publish the status request
//     and read their own replies, nothing else.
//
// Ranks hold no control-plane credential at all.
//
// The server listens on TCP only when some host's agent is remote or it
// admits status clients (Config.StatusNkey: every job gorun's command
// line starts, so a job on this host alone listens on loopback, in plain
// text, nkey authentication only), on loopback unless Config.Bind says
// otherwise (on a wildcard, agents dial
// it at Config.Addrs, URLAt). A listener on any other address requires
// TLS, with a certificate generated for this server alone (in memory,
// never on disk), whose SHA-256 (Fingerprint) the launcher hands to the
// agents with their credentials; agents accept no other certificate
// (control.DialControl). In-process connections need no TLS.
package ctlserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Config configures the server.
type Config struct {
	// Job is the job id, whose subjects the hosts' permissions name.
	Job string
	// Bind is the address to listen on; "" means 127.0.0.1. Any address
	// but a loopback one gets TLS.
	Bind string
	// Addrs are the addresses agents dial (URLAt), which the certificate
	// names: when Bind is a wildcard (0.0.0.0, ::), each host's agent may
	// reach the server at another one. nil = Bind alone.
	Addrs []netip.Addr
	// Port is the port to listen on; 0 picks a free one.
	Port int
	// LocalPassword admits the launcher on in-process connections
	// (control.DialInProcess), with every permission; the password never
	// crosses a socket, and a TCP client cannot use it.
	LocalPassword string
	// Hosts are the job's hosts' users, by host index.
	Hosts []HostUser
	// MaxPayload bounds one message; 0 means 64 MiB, enough for the epoch
	// table of a million ranks.
	MaxPayload int32
	// HostDisconnected, when not nil, is called when a host agent's
	// connection closes, whatever the reason (the agent closed it, its
	// host or the network failed, the server dropped a slow or silent
	// client), with the host's index and the server's reason. It is
	// called from one goroutine, in order; it must not block for long.
	// (The server then runs its system account, internally: the
	// disconnect events are read from $SYS.ACCOUNT.$G.DISCONNECT by a
	// connection of the server's own, in process, no host can make.)
	HostDisconnected func(host int, reason string)
	// StatusNkey, when not "", admits status clients (gorun status) that
	// prove they hold this public nkey's seed, over TCP: they may publish
	// the job's status request and subscribe to their own replies
	// (wire.Subjects.StatusPermissions), nothing else. The server then
	// listens even when no host is remote (on loopback unless Bind says
	// otherwise).
	StatusNkey string
}

// HostUser admits the agent of one host, with that host's permissions.
// Exactly one of its fields is set.
type HostUser struct {
	// Nkey is the public nkey (control.PublicKey) the agent
	// must prove it holds over TCP: the agent is remote.
	Nkey string
	// Password admits the agent on an in-process connection only
	// (jobkey.HostCredentials.InProcessPassword): it runs in the launcher.
	Password string
}

// Server is a running control-plane server.
type Server struct {
	ns  *server.Server
	pin []byte     // SHA-256 of the TLS certificate, or nil
	sys *nats.Conn // reads the disconnect events, or nil
}

// ErrNotReady is returned when the server does not come up in time.
var ErrNotReady = errors.New("ctlserver: server not ready")

// ErrNoAuth is returned for a configuration that would admit anyone.
var ErrNoAuth = errors.New("ctlserver: refusing to run without authentication")

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.LocalPassword == "" {
		return nil, fmt.Errorf("%w: no launcher password", ErrNoAuth)
	}
	if len(cfg.Hosts) > 0 && !wire.ValidJobID(cfg.Job) {
		return nil, fmt.Errorf("ctlserver: invalid job id %q", cfg.Job)
	}
	host := cfg.Bind
	if host == "" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, fmt.Errorf("ctlserver: bind address %q is not an IP address", host)
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	maxPayload := cfg.MaxPayload
	if maxPayload == 0 {
		maxPayload = 64 << 20
	}
	opts := &server.Options{
		ServerName:      "gorun",
		Host:            host,
		Port:            port,
		NoLog:           true,
		NoSigs:          true,
		NoSystemAccount: cfg.HostDisconnected == nil,
		MaxPayload:      maxPayload,
		MaxPending:      int64(maxPayload) * 4,
		PingInterval:    2 * time.Second,
		MaxPingsOut:     3,
		WriteDeadline:   10 * time.Second,
	}
	inProcess := map[string]struct{}{jwt.ConnectionTypeInProcess: {}}
	tcp := map[string]struct{}{jwt.ConnectionTypeStandard: {}}
	opts.Users = []*server.User{{
		Username: wire.InProcessUser, Password: cfg.LocalPassword,
		AllowedConnectionTypes: inProcess,
	}}
	var sysPassword string
	if cfg.HostDisconnected != nil {
		// The system account, with one in-process user: the server's
		// own watcher of disconnect events, by a password made here and
		// never handed out.
		sys := server.NewAccount(sysAccount)
		opts.Accounts, opts.SystemAccount = []*server.Account{sys}, sysAccount
		var b [24]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("ctlserver: %w", err)
		}
		sysPassword = hex.EncodeToString(b[:])
		opts.Users = append(opts.Users, &server.User{Username: sysUser, Password: sysPassword, Account: sys, AllowedConnectionTypes: inProcess})
	}
	hostOf := map[string]int{} // a host user's name or nkey → its index
	listen := false
	if len(cfg.Hosts) > 0 {
		subj := wire.JobSubjects(cfg.Job)
		for i, h := range cfg.Hosts {
			if (h.Nkey == "") == (h.Password == "") {
				return nil, fmt.Errorf("%w: host %d needs exactly one of a key and a password", ErrNoAuth, i)
			}
			pub, sub := subj.HostPermissions(i)
			perms := &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: pub},
				Subscribe: &server.SubjectPermission{Allow: sub},
				// Answers to the requests the host receives (its stdin),
				// one each, however late: the agent answers once the
				// bytes are in the rank's pipe, and a rank may not read
				// for hours. (Only the launcher sends requests to agents.)
				Response: &server.ResponsePermission{MaxMsgs: 1, Expires: math.MaxInt64},
			}
			if h.Nkey != "" {
				hostOf[h.Nkey] = i
				listen = true
				opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: h.Nkey, Permissions: perms, AllowedConnectionTypes: tcp})
			} else {
				hostOf[wire.HostUser(i)] = i
				opts.Users = append(opts.Users, &server.User{
					Username: wire.HostUser(i), Password: h.Password,
					Permissions: perms, AllowedConnectionTypes: inProcess,
				})
			}
		}
	}
	if cfg.StatusNkey != "" {
		if !wire.ValidJobID(cfg.Job) {
			return nil, fmt.Errorf("ctlserver: invalid job id %q", cfg.Job)
		}
		pub, sub := wire.JobSubjects(cfg.Job).StatusPermissions()
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: cfg.StatusNkey, AllowedConnectionTypes: tcp, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: pub},
			Subscribe: &server.SubjectPermission{Allow: sub},
		}})
		listen = true
	}
	var pin []byte
	switch {
	case !listen:
		// A job whose hosts are all local, without status clients,
		// needs no port.
		opts.DontListen = true
	case !ip.IsLoopback():
		ips := []net.IP{ip}
		if len(cfg.Addrs) > 0 {
			ips = ips[:0]
			for _, a := range cfg.Addrs {
				ips = append(ips, a.AsSlice())
			}
		}
		tc, fp, err := selfSigned(ips, cfg.Job)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig, opts.TLSTimeout, pin = tc, 5, fp
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("ctlserver: %w", err)
	}
	// Start returns once the listener is up (its accept loop runs on);
	// ReadyForConnections then answers at once instead of polling every 25 ms.
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("%w: listening on %s", ErrNotReady, net.JoinHostPort(host, strconv.Itoa(cfg.Port)))
	}
	srv := &Server{ns: ns, pin: pin}
	if cfg.HostDisconnected != nil {
		if srv.sys, err = watchDisconnects(ns, sysPassword, hostOf, cfg.HostDisconnected); err != nil {
			ns.Shutdown()
			return nil, err
		}
	}
	return srv, nil
}

// The system account and its one user, the server's disconnect watcher.
const (
	sysAccount = "SYS"
	sysUser    = "gorun-sys"
)

// watchDisconnects subscribes to the disconnect events of the global
// account (every host's and the launcher's connections) and calls f for
// those of a host user (hostOf), in order: one nats.go subscription, one
// goroutine.
func watchDisconnects(ns *server.Server, password string, hostOf map[string]int, f func(int, string)) (*nats.Conn, error) {
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.UserInfo(sysUser, password), nats.Name(sysUser), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("ctlserver: disconnect watcher: %w", err)
	}
	_, err = nc.Subscribe(fmt.Sprintf("$SYS.ACCOUNT.%s.DISCONNECT", server.DEFAULT_GLOBAL_ACCOUNT), func(m *nats.Msg) {
		var e server.DisconnectEventMsg
		if json.Unmarshal(m.Data, &e) != nil {
			return
		}
		if h, ok := hostOf[e.Client.User]; ok {
			f(h, e.Reason)
		}
	})
	if err == nil {
		err = nc.Flush() // subscribed before Start returns
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("ctlserver: disconnect watcher: %w", err)
	}
	return nc, nil
}

// selfSigned makes the server's TLS configuration: a fresh ECDSA P-256
// certificate for ips, valid for this server only, and its SHA-256.
func selfSigned(ips []net.IP, job string) (*tls.Config, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("ctlserver: TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("ctlserver: TLS certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "gorun control plane " + job},
		NotBefore:    now.Add(-time.Hour),
		// Agents check the pin, not the dates; a job may run for long.
		NotAfter:    now.AddDate(10, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("ctlserver: TLS certificate: %w", err)
	}
	fp := sha256.Sum256(der)
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}
	return tc, fp[:], nil
}

// URL is the address agents dial; "" when the server does not listen.
func (s *Server) URL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// URLAt is the address agents dial to reach the server at addr (one of
// Config.Addrs when it listens on a wildcard); "" when it does not listen.
func (s *Server) URLAt(addr netip.Addr) string {
	tcp, ok := s.ns.Addr().(*net.TCPAddr)
	if !ok {
		return ""
	}
	scheme := "nats"
	if s.pin != nil {
		scheme = "tls"
	}
	return scheme + "://" + netip.AddrPortFrom(addr, uint16(tcp.Port)).String()
}

// Fingerprint is the SHA-256 of the server's TLS certificate, which the
// agents pin (jobkey.HostCredentials.Pin); nil when the server does not use
// TLS (it does not listen, or only on loopback).
func (s *Server) Fingerprint() []byte { return s.pin }

// InProcess is the provider for an in-process client connection
// (control.DialInProcess, control.DialInProcessHost).
func (s *Server) InProcess() *server.Server { return s.ns }

// NumClients is the number of connected clients.
func (s *Server) NumClients() int { return s.ns.NumClients() }

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	if s.sys != nil {
		s.sys.Close()
	}
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
