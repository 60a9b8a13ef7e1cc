// Package jobkey holds a job's keys: the launcher's Secret, the keys
// derived from it (Key), each agent's HostCredentials and the sealing that
// carries them to one host over a shared stream. secret.go says who holds
// which and why.
//
// It is used by the launcher (which makes the Secret), by the agents
// (which receive their HostCredentials), by internal/control (which turns a
// host's control key into its NATS nkey) and by comm and the ranks (which
// receive the data-plane Key only). It imports nothing of NATS, so the
// ranks can hold a Key without linking a control-plane client.
//
// Trust model: the Secret never leaves the launcher; every other key is an
// HMAC of it under its own label, so one key reveals neither the Secret nor
// another key. Keys redact themselves in logs and errors and cross process
// boundaries only over pipes and sockets private to the job's user.
package jobkey
