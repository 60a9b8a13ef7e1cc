package wire_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

func TestSockRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	f := &wire.Fence{Epoch: 3, Seq: 2, KV: map[string]string{"a": "1", "b": ""}}
	if err := wire.WriteSock(&buf, wire.SockFence, f); err != nil {
		t.Fatal(err)
	}
	typ, b, err := wire.ReadSock(&buf)
	if err != nil || typ != wire.SockFence {
		t.Fatalf("ReadSock = %d, %v", typ, err)
	}
	got, err := wire.DecodeFence(b, wire.MaxFenceKeys)
	if err != nil || got.Epoch != 3 || got.Seq != 2 || len(got.KV) != 2 {
		t.Fatalf("DecodeFence = %+v, %v", got, err)
	}
}

func TestSockRejects(t *testing.T) {
	frames := map[string][]byte{
		"empty":         {},
		"short header":  {0, 0, 0},
		"zero length":   {0, 0, 0, 0, 1},
		"huge length":   {0xff, 0xff, 0xff, 0xff, 1},
		"truncated":     {0, 0, 0, 9, 1, '{', '}'},
		"just too long": {0x04, 0, 0, 1, 1},
	}
	for name, b := range frames {
		if _, _, err := wire.ReadSock(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: ReadSock accepted %v", name, b)
		}
	}
	many := map[string]string{}
	for i := range wire.MaxFenceKeys + 1 {
		many[strings.Repeat("k", 1+i%200)+string(rune('a'+i%26))+string(rune(i))] = "v"
	}
	bad := map[string]*wire.Fence{
		"negative seq": {Seq: -1},
		"empty key":    {KV: map[string]string{"": "v"}},
		"long key":     {KV: map[string]string{strings.Repeat("k", 300): "v"}},
		"too many":     {KV: many},
	}
	for name, f := range bad {
		if err := f.Check(wire.MaxFenceKeys); !errors.Is(err, wire.ErrMalformed) {
			t.Errorf("%s: Check = %v", name, err)
		}
	}
	if _, err := wire.DecodeFence([]byte(`{"epoch":0,"seq":0,"kv":{},"x":1}`), 10); !errors.Is(err, wire.ErrMalformed) {
		t.Errorf("unknown field accepted: %v", err)
	}
	if _, err := wire.DecodeUpFence([]byte(`{"h":-1,"epoch":0,"seq":0,"kv":{}}`)); !errors.Is(err, wire.ErrMalformed) {
		t.Errorf("negative host accepted: %v", err)
	}
}

func FuzzReadSock(f *testing.F) {
	var buf bytes.Buffer
	wire.WriteSock(&buf, wire.SockHello, &wire.Hello{Version: 1, Pid: 2})
	f.Add(buf.Bytes())
	buf.Reset()
	wire.WriteSock(&buf, wire.SockFence, &wire.Fence{KV: map[string]string{"a": "b"}})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 1, 5})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, payload, err := wire.ReadSock(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(payload)+5 > len(b) {
			t.Fatalf("payload of %d bytes from %d bytes of input", len(payload), len(b))
		}
		if typ == wire.SockFence {
			if f, err := wire.DecodeFence(payload, wire.MaxFenceKeys); err == nil {
				if err := f.Check(wire.MaxFenceKeys); err != nil {
					t.Fatalf("decoded fence fails Check: %v", err)
				}
			}
		}
		var h wire.Hello
		_ = wire.DecodeSock(payload, &h)
	})
}
