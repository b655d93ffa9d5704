package traffic

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

var validHeaders = []Header{
	{Mode: ModeBulkUpload, TestID: 1, Duration: time.Second, Interval: 100 * time.Millisecond, Streams: 1},
	{Mode: ModeBulkDownload, TestID: ^uint64(0), Duration: MaxDuration, Interval: MaxDuration, Streams: MaxStreams},
	{Mode: ModeBulkData, TestID: 42},
	{Mode: ModeUDP, TestID: 7, Duration: 2 * time.Second, Rate: 20e6, Size: 1200},
	{Mode: ModeUDP, TestID: 7, Duration: MinDuration, Rate: MinUDPRate, Size: MinUDPSize},
	{Mode: ModeRR, Size: 64, ResponseSize: 64},
	{Mode: ModeRR, Size: MaxRRSize, ResponseSize: 1},
	{Mode: ModeFileUpload, Size: 10 << 20, Seed: 99},
	{Mode: ModeFileDownload, Size: MaxFileSize},
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range validHeaders {
		b, err := AppendHeader(nil, h)
		if err != nil {
			t.Fatalf("encode %+v: %v", h, err)
		}
		if len(b) != HeaderLen {
			t.Fatalf("encode %+v: %d bytes", h, len(b))
		}
		got, err := DecodeHeader(b)
		if err != nil || got != h {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", h, got, err)
		}
		got, err = ReadHeader(bytes.NewReader(b))
		if err != nil || got != h {
			t.Fatalf("ReadHeader(encode(%+v)) = %+v, %v", h, got, err)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	good, _ := AppendHeader(nil, validHeaders[0])
	mut := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrHeaderLength},
		{"short", good[:HeaderLen-1], ErrHeaderLength},
		{"long", append(bytes.Clone(good), 0), ErrHeaderLength},
		{"magic", mut(func(b []byte) { b[0] = 'X' }), ErrMagic},
		{"version", mut(func(b []byte) { b[4] = 2 }), ErrVersion},
		{"mode 0", mut(func(b []byte) { b[5] = 0 }), ErrMode},
		{"mode 200", mut(func(b []byte) { b[5] = 200 }), ErrMode},
		{"reserved", mut(func(b []byte) { b[7] = 1 }), ErrField},
		{"reserved2", mut(func(b []byte) { b[55] = 1 }), ErrField},
		{"zero streams", mut(func(b []byte) { b[52], b[53] = 0, 0 }), ErrField},
		{"negative duration", mut(func(b []byte) { b[16] = 0xff }), ErrField},
		{"unused field set", mut(func(b []byte) { b[63] = 1 }), ErrField}, // seed, unused by bulk
	}
	for _, c := range cases {
		_, err := DecodeHeader(c.b)
		if !errors.Is(err, c.want) || !errors.Is(err, ErrHeader) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := AppendHeader(nil, Header{Mode: ModeRR}); !errors.Is(err, ErrField) {
		t.Errorf("encoding an invalid header: err = %v", err)
	}
	// ReadHeader turns a foreign protocol away after four bytes, without waiting for more.
	if _, err := ReadHeader(io.MultiReader(bytes.NewReader([]byte("GET ")), blockingReader{})); !errors.Is(err, ErrMagic) {
		t.Errorf("ReadHeader(GET ...) = %v", err)
	}
}

type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { panic("read past the magic") }

// headerErrs is the documented set of decoding errors.
var headerErrs = []error{ErrHeaderLength, ErrMagic, ErrVersion, ErrMode, ErrField}

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range validHeaders {
		b, _ := AppendHeader(nil, h)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("BRTF"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789012345678901234567890123456789"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			known := false
			for _, e := range headerErrs {
				known = known || errors.Is(err, e)
			}
			if !known || !errors.Is(err, ErrHeader) {
				t.Fatalf("DecodeHeader(%x) returned an undocumented error: %v", b, err)
			}
		} else {
			enc, err := AppendHeader(nil, h)
			if err != nil {
				t.Fatalf("decoded header %+v does not encode: %v", h, err)
			}
			if !bytes.Equal(enc, b) {
				t.Fatalf("encoding is not canonical:\n in  %x\n out %x", b, enc)
			}
			h2, err := DecodeHeader(enc)
			if err != nil || h2 != h {
				t.Fatalf("decode(encode(%+v)) = %+v, %v", h, h2, err)
			}
		}
		// ReadHeader agrees with DecodeHeader on the first HeaderLen bytes and never panics.
		rh, rerr := ReadHeader(bytes.NewReader(b))
		if len(b) >= HeaderLen {
			dh, derr := DecodeHeader(b[:HeaderLen])
			if (rerr == nil) != (derr == nil) || rh != dh {
				t.Fatalf("ReadHeader = %+v, %v; DecodeHeader = %+v, %v", rh, rerr, dh, derr)
			}
		} else if rerr == nil {
			t.Fatalf("ReadHeader accepted %d bytes", len(b))
		}
	})
}

func TestRecordCodec(t *testing.T) {
	r := record{typ: recFinal, v: [6]uint64{1, 2, 3, 4, 5, ^uint64(0)}}
	b := r.encode()
	got, err := decodeRecord(b[:])
	if err != nil || got != r {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", r, got, err)
	}
	b[3] = 1
	if _, err := decodeRecord(b[:]); !errors.Is(err, errRecord) {
		t.Fatalf("padding: err = %v", err)
	}
	b[3], b[0] = 0, 0
	if _, err := decodeRecord(b[:]); !errors.Is(err, errRecord) {
		t.Fatalf("type 0: err = %v", err)
	}
	if _, err := decodeRecord(b[:10]); !errors.Is(err, errRecord) {
		t.Fatalf("short: err = %v", err)
	}
}
