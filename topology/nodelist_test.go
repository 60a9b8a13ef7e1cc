package topology

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestExpandNodeList(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"login", []string{"login"}},
		{"a,b,c", []string{"a", "b", "c"}},
		{"node[1-3]", []string{"node1", "node2", "node3"}},
		{"node[01-04,07]", []string{"node01", "node02", "node03", "node04", "node07"}},
		{"node[01-04,07],gpu[1-2]x,login", []string{"node01", "node02", "node03", "node04", "node07", "gpu1x", "gpu2x", "login"}},
		// Padding follows the written lower bound.
		{"n[08-11]", []string{"n08", "n09", "n10", "n11"}},
		{"n[8-11]", []string{"n8", "n9", "n10", "n11"}},
		{"n[098-101]", []string{"n098", "n099", "n100", "n101"}},
		{"n[1-010]", []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"}},
		{"n[007]", []string{"n007"}},
		{"n[0]", []string{"n0"}},
		{"n[1,01,001]", []string{"n1", "n01", "n001"}},
		// Several ranges and single numbers in one bracket, in written order.
		{"n[5,1-2,9]", []string{"n5", "n1", "n2", "n9"}},
		{"n[3-3]", []string{"n3"}},
		// Several bracket groups: the leftmost varies slowest.
		{"r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}},
		{"r[1-2]n[01,3]x[7]", []string{"r1n01x7", "r1n3x7", "r2n01x7", "r2n3x7"}},
		{"[1-2]n", []string{"1n", "2n"}},
		// Suffixes and dots.
		{"gpu[1-2]-ib", []string{"gpu1-ib", "gpu2-ib"}},
		{"node[1-2].cluster.org", []string{"node1.cluster.org", "node2.cluster.org"}},
		{"10.0.[0-1].[9-10]", []string{"10.0.0.9", "10.0.0.10", "10.0.1.9", "10.0.1.10"}},
		// Commas inside brackets do not split; commas outside do.
		{"a[1,2],b[3,4]", []string{"a1", "a2", "b3", "b4"}},
		{"a[1,2]b,c", []string{"a1b", "a2b", "c"}},
		// Duplicates are kept.
		{"a,a,n[1,1]", []string{"a", "a", "n1", "n1"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ExpandNodeList(tt.in)
			if err != nil {
				t.Fatalf("ExpandNodeList(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ExpandNodeList(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestExpandNodeListLarge(t *testing.T) {
	got, err := ExpandNodeList("n[000001-100000],x")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 100001 || got[0] != "n000001" || got[99999] != "n100000" || got[100000] != "x" {
		t.Errorf("got %d names, first %q, last %q", len(got), got[0], got[len(got)-1])
	}
}

func TestExpandNodeListErrors(t *testing.T) {
	tests := []struct {
		in   string
		kind error
		msg  string
	}{
		{"", ErrBadNodeList, "empty node list"},
		{",a", ErrBadNodeList, "empty entry at byte 1"},
		{"a,,b", ErrBadNodeList, "empty entry at byte 3"},
		{"a,", ErrBadNodeList, "empty entry at end"},
		{"node[1-3", ErrBadNodeList, "unclosed '[' at byte 5"},
		{"node[1-3,a", ErrBadNodeList, "unclosed '['"},
		{"node1-3]", ErrBadNodeList, "unmatched ']' at byte 8"},
		{"n[1[2]]", ErrBadNodeList, "nested '[' at byte 4"},
		{"n[]", ErrBadNodeList, `empty brackets in "n[]"`},
		{"n[1,]", ErrBadNodeList, `empty range in [1,] of "n[1,]"`},
		{"n[,1]", ErrBadNodeList, "empty range"},
		{"n[3-1]", ErrBadNodeList, `reversed range 3-1 in "n[3-1]"`},
		{"n[-1]", ErrBadNodeList, `missing number in range "-1"`},
		{"n[1-]", ErrBadNodeList, `missing number in range "1-"`},
		{"n[1-2-3]", ErrBadNodeList, `invalid character '-' in range "1-2-3"`},
		{"n[a]", ErrBadNodeList, `invalid character 'a' in range "a"`},
		{"n[ 1]", ErrBadNodeList, `invalid character ' '`},
		{"n[1234567890123456789]", ErrBadNodeList, "more than 18 digits"},
		{"n[1-1000001]", ErrTooLarge, `too many hosts: "n[1-1000001]" takes the count past the limit of 1000000`},
		{"n[1-999999999999999999]", ErrTooLarge, "past the limit"},
		{"n[1-500000,1-500001]", ErrTooLarge, "past the limit"},
		{"r[1-1000]n[1-1001]", ErrTooLarge, "past the limit"},
		{"n[1-600000],m[1-400001]", ErrTooLarge, `"m[1-400001]" takes the count past the limit`},
		{"no de", ErrBadHostName, `invalid character ' ' in host name "no de"`},
		{"n@[1-2]", ErrBadHostName, `invalid character '@'`},
		{"-n[1-2]", ErrBadHostName, "starting or ending with '-'"},
		{"[1-2]", ErrBadHostName, `host name "1" is all digits`},
		{"a..[1-2]", ErrBadHostName, "empty label"},
		{"a:2", ErrBadHostName, "invalid character ':'"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ExpandNodeList(tt.in)
			if err == nil {
				t.Fatalf("ExpandNodeList(%q) = %q; want error %v", tt.in, got, tt.kind)
			}
			if !errors.Is(err, tt.kind) {
				t.Errorf("ExpandNodeList(%q) = %q; does not wrap %v", tt.in, err, tt.kind)
			}
			if !strings.HasPrefix(err.Error(), "topology: node list") || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("ExpandNodeList(%q) = %q; want topology: node list...%s...", tt.in, err, tt.msg)
			}
		})
	}
}

func TestCheckHostName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"node-01", true},
		{"gpu_01", true},
		{"_svc", true},
		{"a1.b2.c3", true},
		{"1node", true},
		{"0", false},
		{"1.2.3", false},
		{"1.2.3.4", true},
		{"255.255.255.255", true},
		{"256.1.1.1", false},
		{"01.2.3.4", false},
		{"1.2.3.4.5", false},
		{"1.2.3.x", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{strings.Repeat("a.", 126) + "a", true}, // 253 bytes
		{strings.Repeat("a.", 126) + "ab", false},
		{"", false},
		{".a", false},
		{"a.", false},
		{"a-", false},
		{"a.-b", false},
		{"a b", false},
		{"a/b", false},
		{"a:b", false},
		{"a%b", false},
		{"é", false},
	}
	for _, tt := range tests {
		err := checkHostName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("checkHostName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrBadHostName) {
			t.Errorf("checkHostName(%q) = %v; does not wrap ErrBadHostName", tt.name, err)
		}
	}
}
