// Package comm is how gorun's processes find each other: the per-job
// secret and the keys derived from it (secret.go says who holds which), the
// authenticated control-plane connection (NATS) that agents hold to the
// launcher, and the rendezvous that turns agent registrations into the
// epoch table every rank's world is built from; and the ranks' data plane:
// the communicator (Init, Comm) with its authenticated links, point-to-point
// messages, collectives and epoch rebuild.
//
// Authentication never sends a key: an agent's control-plane key is the
// seed of an ed25519 key (a NATS nkey) and the agent proves it holds the
// seed by signing the server's nonce; data-plane links run an HMAC
// challenge-response.
package comm
