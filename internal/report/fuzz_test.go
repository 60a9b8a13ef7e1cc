package report

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/gorun/gorun/internal/events"
)

// FuzzReport: whatever an events file holds, reading it either fails
// with an error or gives a page; nothing panics.
func FuzzReport(f *testing.F) {
	b, err := os.ReadFile(fixture)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, events.MaxLine)
	var launch []byte
	for sc.Scan() {
		if launch == nil {
			launch = append([]byte(nil), sc.Bytes()...)
			continue
		}
		f.Add(append(append(append([]byte(nil), launch...), '\n'), sc.Bytes()...))
	}
	f.Add([]byte(`{"t":0,"event":"launch","hosts":[{"name":"a"}]}` + "\n" + `{"t":1,"event":"sample","min":[1,2,3],"max":[],"wait":[1],"stages":[5,6]}`))
	f.Add([]byte(`{"t":0,"event":"launch","hosts":[]}` + "\n" + `{"t":1e300,"event":"timeline","detected":5,"resumed":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		if err := Render(io.Discard, m); err != nil {
			t.Fatal(err)
		}
	})
}
