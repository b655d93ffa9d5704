package traffic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Wire protocol, version 1.
//
// Every TCP connection to a Server starts with one Header of exactly HeaderLen bytes sent by the
// client. The server answers with one status byte (statusOK or a rejection code, after which it
// closes the connection), and then the mode's own exchange follows:
//
//	ModeBulkUpload, ModeBulkDownload  control connection of a bulk test: 56-byte records both ways
//	ModeBulkData                      one data stream of a bulk test: raw payload bytes
//	ModeUDP                           control connection of a UDP test: 56-byte records both ways
//	ModeRR                            Size-byte requests answered by ResponseSize-byte responses
//	ModeFileUpload, ModeFileDownload  Size payload bytes, then a 56-byte report or trailer record
//
// Header layout (all integers big-endian):
//
//	off len field
//	  0   4 magic "BRTF"
//	  4   1 version (1)
//	  5   1 mode
//	  6   2 reserved, zero
//	  8   8 test id
//	 16   8 duration, nanoseconds
//	 24   8 interval, nanoseconds
//	 32   8 rate, bit/s
//	 40   8 size
//	 48   4 response size
//	 52   2 streams
//	 54   2 reserved, zero
//	 56   8 seed
//
// Fields a mode does not use must be zero, so every valid header has exactly one encoding.

// HeaderLen is the length of an encoded Header.
const HeaderLen = 64

// Version is the protocol version this package speaks.
const Version = 1

const magic = "BRTF"

// Mode says what a connection is for.
type Mode uint8

// Modes.
const (
	ModeBulkUpload   Mode = 1 // bulk control connection, client sends
	ModeBulkDownload Mode = 2 // bulk control connection, server sends
	ModeBulkData     Mode = 3 // one data stream of the bulk test TestID
	ModeUDP          Mode = 4 // UDP test control connection
	ModeRR           Mode = 5 // request/response
	ModeFileUpload   Mode = 6 // file transfer, client sends
	ModeFileDownload Mode = 7 // file transfer, server sends
)

func (m Mode) String() string {
	switch m {
	case ModeBulkUpload:
		return "bulk-upload"
	case ModeBulkDownload:
		return "bulk-download"
	case ModeBulkData:
		return "bulk-data"
	case ModeUDP:
		return "udp"
	case ModeRR:
		return "rr"
	case ModeFileUpload:
		return "file-upload"
	case ModeFileDownload:
		return "file-download"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Limits enforced on header fields.
const (
	MinDuration     = 10 * time.Millisecond
	MaxDuration     = 24 * time.Hour
	MinInterval     = 10 * time.Millisecond
	MaxStreams      = 128
	MinUDPSize      = 32    // smallest UDP payload: the datagram header plus padding
	MaxUDPSize      = 65507 // largest UDP payload over IPv4
	MinUDPRate      = 1000  // bit/s
	MaxUDPRate      = 1e12  // bit/s
	MaxRRSize       = 1 << 20
	MaxFileSize     = 1 << 50
	udpDatagramHead = 28 // magic(4) test id(8) seq(8) send time(8)
)

// Header opens every TCP connection. Which fields are used depends on Mode:
//
//	ModeBulkUpload/Download: TestID, Duration, Interval, Streams
//	ModeBulkData:            TestID
//	ModeUDP:                 TestID, Duration, Rate, Size (UDP payload bytes)
//	ModeRR:                  Size (request bytes), ResponseSize
//	ModeFileUpload/Download: Size (bytes), Seed
type Header struct {
	Mode         Mode
	TestID       uint64
	Duration     time.Duration
	Interval     time.Duration
	Rate         uint64
	Size         uint64
	ResponseSize uint32
	Streams      uint16
	Seed         uint64
}

// Header errors. Every error returned by DecodeHeader, ReadHeader's decoding step and AppendHeader
// is one of ErrHeaderLength, ErrMagic, ErrVersion, ErrMode or ErrField, possibly wrapped with
// detail; all of them match errors.Is(err, ErrHeader). ReadHeader may also return I/O errors.
var (
	ErrHeader       = errors.New("traffic: bad header")
	ErrHeaderLength = fmt.Errorf("%w: wrong length", ErrHeader)
	ErrMagic        = fmt.Errorf("%w: bad magic", ErrHeader)
	ErrVersion      = fmt.Errorf("%w: unsupported version", ErrHeader)
	ErrMode         = fmt.Errorf("%w: unknown mode", ErrHeader)
	ErrField        = fmt.Errorf("%w: field out of range", ErrHeader)
)

func fieldErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrField, fmt.Sprintf(format, a...))
}

// Validate checks h's fields against its mode; it returns nil or an error matching ErrMode or
// ErrField.
func (h Header) Validate() error {
	used := struct{ id, dur, interval, rate, size, resp, streams, seed bool }{}
	switch h.Mode {
	case ModeBulkUpload, ModeBulkDownload:
		used.id, used.dur, used.interval, used.streams = true, true, true, true
		if h.Interval < MinInterval || h.Interval > h.Duration {
			return fieldErr("interval %v not in [%v, duration]", h.Interval, MinInterval)
		}
		if h.Streams < 1 || h.Streams > MaxStreams {
			return fieldErr("streams %d not in [1, %d]", h.Streams, MaxStreams)
		}
	case ModeBulkData:
		used.id = true
	case ModeUDP:
		used.id, used.dur, used.rate, used.size = true, true, true, true
		if h.Rate < MinUDPRate || h.Rate > MaxUDPRate {
			return fieldErr("rate %d not in [%d, %d]", h.Rate, MinUDPRate, uint64(MaxUDPRate))
		}
		if h.Size < MinUDPSize || h.Size > MaxUDPSize {
			return fieldErr("UDP size %d not in [%d, %d]", h.Size, MinUDPSize, MaxUDPSize)
		}
	case ModeRR:
		used.size, used.resp = true, true
		if h.Size < 1 || h.Size > MaxRRSize || h.ResponseSize < 1 || h.ResponseSize > MaxRRSize {
			return fieldErr("request/response size %d/%d not in [1, %d]", h.Size, h.ResponseSize, MaxRRSize)
		}
	case ModeFileUpload, ModeFileDownload:
		used.size, used.seed = true, true
		if h.Size < 1 || h.Size > MaxFileSize {
			return fieldErr("file size %d not in [1, %d]", h.Size, uint64(MaxFileSize))
		}
	default:
		return fmt.Errorf("%w %d", ErrMode, uint8(h.Mode))
	}
	if used.id && h.TestID == 0 {
		return fieldErr("test id is zero")
	}
	if used.dur && (h.Duration < MinDuration || h.Duration > MaxDuration) {
		return fieldErr("duration %v not in [%v, %v]", h.Duration, MinDuration, MaxDuration)
	}
	if (!used.id && h.TestID != 0) || (!used.dur && h.Duration != 0) ||
		(!used.interval && h.Interval != 0) || (!used.rate && h.Rate != 0) ||
		(!used.size && h.Size != 0) || (!used.resp && h.ResponseSize != 0) ||
		(!used.streams && h.Streams != 0) || (!used.seed && h.Seed != 0) {
		return fieldErr("field unused by mode %v is not zero", h.Mode)
	}
	return nil
}

// AppendHeader appends the encoding of h to b. It refuses (with the Validate error) to encode an
// invalid header.
func AppendHeader(b []byte, h Header) ([]byte, error) {
	if err := h.Validate(); err != nil {
		return b, err
	}
	b = append(b, magic...)
	b = append(b, Version, byte(h.Mode), 0, 0)
	b = binary.BigEndian.AppendUint64(b, h.TestID)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Duration))
	b = binary.BigEndian.AppendUint64(b, uint64(h.Interval))
	b = binary.BigEndian.AppendUint64(b, h.Rate)
	b = binary.BigEndian.AppendUint64(b, h.Size)
	b = binary.BigEndian.AppendUint32(b, h.ResponseSize)
	b = binary.BigEndian.AppendUint16(b, h.Streams)
	b = append(b, 0, 0)
	b = binary.BigEndian.AppendUint64(b, h.Seed)
	return b, nil
}

// DecodeHeader decodes exactly one header from b, which must be HeaderLen bytes long.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) != HeaderLen {
		return Header{}, fmt.Errorf("%w: %d bytes, want %d", ErrHeaderLength, len(b), HeaderLen)
	}
	if string(b[:4]) != magic {
		return Header{}, ErrMagic
	}
	if b[4] != Version {
		return Header{}, fmt.Errorf("%w %d", ErrVersion, b[4])
	}
	if b[6] != 0 || b[7] != 0 || b[54] != 0 || b[55] != 0 {
		return Header{}, fieldErr("reserved bytes are not zero")
	}
	be := binary.BigEndian
	dur, interval := be.Uint64(b[16:]), be.Uint64(b[24:])
	if dur > uint64(MaxDuration) || interval > uint64(MaxDuration) {
		return Header{}, fieldErr("duration or interval too large")
	}
	h := Header{
		Mode:         Mode(b[5]),
		TestID:       be.Uint64(b[8:]),
		Duration:     time.Duration(dur),
		Interval:     time.Duration(interval),
		Rate:         be.Uint64(b[32:]),
		Size:         be.Uint64(b[40:]),
		ResponseSize: be.Uint32(b[48:]),
		Streams:      be.Uint16(b[52:]),
		Seed:         be.Uint64(b[56:]),
	}
	if err := h.Validate(); err != nil {
		return Header{}, err
	}
	return h, nil
}

// ReadHeader reads and decodes one header from r. It checks the magic as soon as the first four
// bytes arrive, so a peer speaking another protocol is turned away without waiting for 64 bytes.
func ReadHeader(r io.Reader) (Header, error) {
	var b [HeaderLen]byte
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return Header{}, fmt.Errorf("traffic: reading header: %w", err)
	}
	if string(b[:4]) != magic {
		return Header{}, ErrMagic
	}
	if _, err := io.ReadFull(r, b[4:]); err != nil {
		return Header{}, fmt.Errorf("traffic: reading header: %w", err)
	}
	return DecodeHeader(b[:])
}

// Status is the byte the server answers a header with.
type status uint8

const (
	statusOK          status = 0
	statusBadHeader   status = 1
	statusUnknownTest status = 2
	statusDuplicate   status = 3
	statusTooLarge    status = 4
	statusUnsupported status = 5
	statusBusy        status = 6
)

// errRejected is wrapped by the client error for a non-OK status.
var errRejected = errors.New("traffic: server rejected the request")

func (s status) err() error {
	var why string
	switch s {
	case statusOK:
		return nil
	case statusBadHeader:
		why = "bad header"
	case statusUnknownTest:
		why = "unknown test id"
	case statusDuplicate:
		why = "test id already in use"
	case statusTooLarge:
		why = "test too large"
	case statusUnsupported:
		why = "not supported by this server"
	case statusBusy:
		why = "test already running"
	default:
		why = fmt.Sprintf("status %d", uint8(s))
	}
	return fmt.Errorf("%w: %s", errRejected, why)
}

// Records are the fixed-size messages exchanged on control connections and after file
// transfers: type(1) zero(7) six big-endian uint64 values.
const recordLen = 56

type recType uint8

const (
	recStart      recType = 1  // server→client: bulk test starts now
	recSample     recType = 2  // server→client (upload): v0 index, v1 end of interval ns, v2 bytes in interval, v3 interval length ns
	recFinal      recType = 3  // server→client: v0 bytes, v1 measured ns, v2 retransmits (download)
	recStop       recType = 4  // client→server (download): measurement window over
	recUDPReady   recType = 5  // server→client: v0 UDP port of the server
	recUDPRequest recType = 6  // client→server: v0 datagrams sent
	recUDPReport  recType = 7  // server→client: v0 received, v1 duplicates, v2 reordered, v3 jitter ns, v4 ignored
	recFileReport recType = 8  // receiver→sender: v0 bytes, v1..v4 SHA-256
	recFileSum    recType = 9  // sender→receiver trailer: v1..v4 SHA-256 of what was sent
	recProgress   recType = 10 // receiver→sender during a file upload: v0 bytes so far
)

type record struct {
	typ recType
	v   [6]uint64
}

var errRecord = errors.New("traffic: malformed record")

func (r record) encode() [recordLen]byte {
	var b [recordLen]byte
	b[0] = byte(r.typ)
	for i, v := range r.v {
		binary.BigEndian.PutUint64(b[8+8*i:], v)
	}
	return b
}

func decodeRecord(b []byte) (record, error) {
	if len(b) != recordLen {
		return record{}, fmt.Errorf("%w: %d bytes", errRecord, len(b))
	}
	r := record{typ: recType(b[0])}
	if r.typ < recStart || r.typ > recProgress {
		return record{}, fmt.Errorf("%w: type %d", errRecord, b[0])
	}
	for _, z := range b[1:8] {
		if z != 0 {
			return record{}, fmt.Errorf("%w: padding not zero", errRecord)
		}
	}
	for i := range r.v {
		r.v[i] = binary.BigEndian.Uint64(b[8+8*i:])
	}
	return r, nil
}

func writeRecord(w io.Writer, r record) error {
	b := r.encode()
	_, err := w.Write(b[:])
	return err
}

// readRecord reads one record and checks that it has type want.
func readRecord(rd io.Reader, want recType) (record, error) {
	var b [recordLen]byte
	if _, err := io.ReadFull(rd, b[:]); err != nil {
		return record{}, err
	}
	r, err := decodeRecord(b[:])
	if err != nil {
		return record{}, err
	}
	if want != 0 && r.typ != want {
		return record{}, fmt.Errorf("%w: type %d, want %d", errRecord, r.typ, want)
	}
	return r, nil
}

func sumToWords(s [32]byte) (w [4]uint64) {
	for i := range w {
		w[i] = binary.BigEndian.Uint64(s[8*i:])
	}
	return w
}

func wordsToSum(w []uint64) (s [32]byte) {
	for i := 0; i < 4 && i < len(w); i++ {
		binary.BigEndian.PutUint64(s[8*i:], w[i])
	}
	return s
}

// UDP datagram layout: magic "BRTU", test id, sequence number, send time in nanoseconds since
// the client's start of sending; the rest of the datagram is padding.
const udpMagic = "BRTU"

func parseDatagram(b []byte) (id, seq uint64, sent int64, ok bool) {
	if len(b) < udpDatagramHead || string(b[:4]) != udpMagic {
		return 0, 0, 0, false
	}
	be := binary.BigEndian
	return be.Uint64(b[4:]), be.Uint64(b[12:]), int64(be.Uint64(b[20:])), true
}
