// Package ctlserver runs a job's embedded control-plane server: a NATS
// server that admits only holders of the job secret (by nkey signature) and
// listens on loopback unless told otherwise. It is the only package of gorun
// that imports nats-server.
package ctlserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// Config configures the server.
type Config struct {
	// Bind is the address to listen on; "" means 127.0.0.1.
	Bind string
	// Port is the port to listen on; 0 picks a free one.
	Port int
	// PublicKey is the nkey (comm.Secret.PublicKey) a client connecting
	// over TCP must prove it holds. Without it the server does not listen
	// on TCP at all (a job whose hosts are all local needs no port).
	PublicKey string
	// LocalPassword admits in-process clients (comm.DialInProcess); the
	// password never crosses a socket, and a TCP client cannot use it.
	LocalPassword string
	// MaxPayload bounds one message; 0 means 64 MiB, enough for the epoch
	// table of a million ranks.
	MaxPayload int32
}

// Server is a running control-plane server.
type Server struct {
	ns *server.Server
}

// ErrNotReady is returned when the server does not come up in time.
var ErrNotReady = errors.New("ctlserver: server not ready")

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.PublicKey == "" && cfg.LocalPassword == "" {
		return nil, errors.New("ctlserver: no public key and no local password: refusing to run without authentication")
	}
	host := cfg.Bind
	if host == "" {
		host = "127.0.0.1"
	}
	if net.ParseIP(host) == nil {
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
		NoSystemAccount: true,
		MaxPayload:      maxPayload,
		MaxPending:      int64(maxPayload) * 4,
		PingInterval:    2 * time.Second,
		MaxPingsOut:     3,
		WriteDeadline:   10 * time.Second,
	}
	if cfg.PublicKey != "" {
		opts.Nkeys = []*server.NkeyUser{{Nkey: cfg.PublicKey}}
	} else {
		opts.DontListen = true
	}
	if cfg.LocalPassword != "" {
		opts.Users = []*server.User{{
			Username: wire.InProcessUser, Password: cfg.LocalPassword,
			AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeInProcess: {}},
		}}
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
	return &Server{ns: ns}, nil
}

// URL is the address agents dial; "" when the server does not listen.
func (s *Server) URL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// InProcess is the provider for an in-process client connection
// (comm.DialInProcess).
func (s *Server) InProcess() *server.Server { return s.ns }

// NumClients is the number of connected clients.
func (s *Server) NumClients() int { return s.ns.NumClients() }

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
