// Package control is gorun's control plane as its clients see it: the
// authenticated NATS connection (Control) the launcher and each agent hold
// to the job's embedded server (internal/ctlserver), the rendezvous that
// turns agent registrations into the epoch table every rank's world is
// built from (Rendezvous, AgentRendezvous), the launcher's fence collector
// (FenceCollector), and the NATS nkey of a host's control key (PublicKey).
//
// It is used by the launcher and internal/agent only. Ranks never talk to
// the control plane (they reach their agent over a Unix socket, see
// comm.Init), so comm and everything a trainer links must not import this
// package: internal/depcheck keeps NATS out of them.
//
// Trust model (the keys are internal/jobkey's, which says who holds
// which): the launcher connects in-process with its Secret's password and
// may publish on every subject; an agent connects as its own host's user,
// proving it holds the host's nkey seed by signing the server's nonce (the
// seed never crosses the wire), over TLS pinned to the job's certificate
// when HostCredentials.Pin is set, and may publish only its host's
// subjects. A compromised host can therefore speak on the control plane
// only as itself.
package control
