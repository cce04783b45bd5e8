package idempotency

import (
	"bytes"
	"io"
	"reflect"
	"testing"
	"testing/iotest"
)

// The handler's body reads as bytes.NewReader(body) would: iotest's
// checks (Read in every size, after EOF, WriteTo) pass for every length.
func TestBodyReader(t *testing.T) {
	for _, n := range []int{0, 1, 7, 4096, 70000} {
		want := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		var r bodyReader
		r.reset(want)
		if err := iotest.TestReader(&r, want); err != nil {
			t.Errorf("%d bytes: %v", n, err)
		}
		r.reset(want)
		var got bytes.Buffer
		if m, err := io.Copy(&got, &r); err != nil || m != int64(n) || !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%d bytes: io.Copy = %d, %v", n, m, err)
		}
		if m, err := r.Read(make([]byte, 1)); m != 0 || err != io.EOF {
			t.Errorf("%d bytes: Read after the end = %d, %v; want 0, EOF", n, m, err)
		}
	}
}

// A Call fits a 512-byte size class: it is the one allocation a first use
// makes per request beyond the store's.
func TestCallSize(t *testing.T) {
	if n := reflect.TypeFor[Call]().Size(); n > 512 {
		t.Errorf("Call is %d bytes; want at most 512", n)
	}
}
