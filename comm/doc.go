// Package comm is what a Go rank links to talk to its peers: the
// communicator (Init, Comm) over the ranks' data plane, with its
// authenticated links (TCP, Unix sockets, shared-memory rings between
// ranks of one host), point-to-point messages, collectives and epoch
// rebuild, and the authenticated agent-to-agent links (DialLink,
// AcceptLink) the rank services use.
//
// A rank reaches its agent over a Unix socket (GORUN_SOCKET, see Init):
// never the control plane. So comm is not a NATS client; the control
// plane's client, the rendezvous and the fences are internal/control's,
// used by the launcher and the agents, and internal/depcheck keeps NATS
// out of comm and of what a trainer links. The keys are internal/jobkey's:
// a rank holds the job's data-plane key only, and links authenticate with
// an HMAC challenge-response that never sends it.
package comm
