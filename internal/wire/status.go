package wire

import "strings"

// The status request (gorun status): a status client, holding the job's
// status credential (never a host's), asks the launcher for a snapshot of
// the job on Status and receives it on its own inbox, under StatusInbox.
// The status user may publish on Status alone and subscribe under
// StatusInbox alone (StatusPermissions); the launcher answers only at a
// reply subject under StatusInbox (StatusReplyAllowed), so the status
// credential cannot make the launcher publish anywhere else.

// Status is the subject of status requests (StatusRequest), from status
// clients to the launcher.
func (s Subjects) Status() string { return s.prefix + "status" }

// StatusInbox is the prefix of the status clients' reply subjects
// (nats.CustomInboxPrefix).
func (s Subjects) StatusInbox() string { return s.prefix + "statusinbox" }

// StatusPermissions are the subjects the status user may publish to and
// subscribe to.
func (s Subjects) StatusPermissions() (publish, subscribe []string) {
	return []string{s.Status()}, []string{s.StatusInbox() + ".>"}
}

// StatusReplyAllowed reports whether the launcher may answer a status
// request at reply: a concrete subject under StatusInbox.
func (s Subjects) StatusReplyAllowed(reply string) bool {
	rest, ok := strings.CutPrefix(reply, s.StatusInbox()+".")
	return ok && rest != "" && len(reply) <= MaxStringLen && !strings.ContainsAny(rest, "*> \t\r\n")
}

// StatusRequest asks the launcher for a snapshot of the job
// (jobstatus.Snapshot, JSON) in reply.
type StatusRequest struct {
	// Ranks asks for every rank's row too (O(ranks) bytes).
	Ranks bool `json:"ranks,omitempty"`
}

// DecodeStatusRequest decodes a StatusRequest; an empty message is the
// zero request.
func DecodeStatusRequest(b []byte) (*StatusRequest, error) {
	var r StatusRequest
	if len(b) == 0 {
		return &r, nil
	}
	if len(b) > MaxStringLen {
		return nil, malformed("status request: %d bytes", len(b))
	}
	if err := decode(b, &r, "status request"); err != nil {
		return nil, err
	}
	return &r, nil
}
