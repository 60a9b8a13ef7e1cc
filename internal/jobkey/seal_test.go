package jobkey

import (
	"errors"
	"testing"
)

func TestSealHostCredentials(t *testing.T) {
	s, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	k0, err := NewSealKey()
	if err != nil {
		t.Fatal(err)
	}
	k1, err := NewSealKey()
	if err != nil {
		t.Fatal(err)
	}
	pin := make([]byte, 32)
	pin[3] = 7
	c0 := s.HostCredentials(0, pin)
	sealed0, err := SealHostCredentials(c0, "job1", k0.PublicKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenHostCredentials(sealed0, "job1", 0, k0)
	if err != nil {
		t.Fatalf("opening host 0's own line: %v", err)
	}
	if got.Encode() != c0.Encode() {
		t.Fatalf("opened %v, sealed %v", got.Encode(), c0.Encode())
	}
	sealed1, err := SealHostCredentials(s.HostCredentials(1, pin), "job1", k1.PublicKey().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	tampered := []byte(sealed0)
	tampered[len(tampered)-5] ^= 1
	if tampered[len(tampered)-5] == '/' || tampered[len(tampered)-5] == '+' {
		tampered[len(tampered)-5] = 'A'
	}
	for _, tc := range []struct {
		name   string
		sealed string
		job    string
		host   int
	}{
		{"another host's line", sealed1, "job1", 1},
		{"its line read as another host's", sealed0, "job1", 1},
		{"another job", sealed0, "job2", 0},
		{"tampered", string(tampered), "job1", 0},
		{"truncated", sealed0[:40], "job1", 0},
		{"not base64", "!!" + sealed0, "job1", 0},
		{"empty", "", "job1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c, err := OpenHostCredentials(tc.sealed, tc.job, tc.host, k0); !errors.Is(err, ErrBadSecret) {
				t.Fatalf("opened with host 0's key: %v, %v; want ErrBadSecret", c, err)
			}
		})
	}
	if _, err := SealHostCredentials(c0, "job1", []byte("short")); !errors.Is(err, ErrBadSecret) {
		t.Errorf("sealing to a bad key: %v", err)
	}
}
