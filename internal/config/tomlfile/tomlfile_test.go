package tomlfile

import (
	"errors"
	"strings"
	"testing"
)

type peer struct {
	Name string `toml:"name"`
	Port int    `toml:"port"`
}

type file struct {
	Title string `toml:"title"`
	Peer  []peer `toml:"peer"`
}

func TestDecodeIndexesKeys(t *testing.T) {
	data := []byte("title = \"x\"\n\n[[peer]]\nname = \"a\"\n[[peer]]\nname = \"b\"\nport = 7\n")
	var f file
	ix, err := Decode("site.toml", data, &f)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Peer) != 2 || f.Peer[1].Port != 7 {
		t.Fatalf("decoded %+v", f)
	}
	for path, line := range map[string]int{"title": 1, "peer[0]": 3, "peer[0].name": 4, "peer[1].port": 7} {
		if got := ix.Line(path); got != line {
			t.Errorf("Line(%q) = %d, want %d", path, got, line)
		}
	}
	if got := ix.Line("peer[1].missing"); got != 5 {
		t.Errorf("a missing key falls back to its table: got line %d, want 5", got)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, c := range []struct{ name, data, want string }{
		{"unknown key", "[[peer]]\nname = \"a\"\nprot = 1\n", `site.toml:3:1: unknown key "peer[0].prot"`},
		{"wrong type", "[[peer]]\nport = \"x\"\n", "site.toml:2"},
		{"syntax", "title = \n", "site.toml:1"},
	} {
		var f file
		_, err := Decode("site.toml", []byte(c.data), &f)
		var e *Error
		if err == nil || !errors.As(err, &e) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{File: "f", Line: 3, Column: 2, Object: "peer a", Reason: "bad"}, "f:3:2: peer a: bad"},
		{Error{File: "f", Reason: "bad"}, "f: bad"},
		{Error{Line: 4, Reason: "bad"}, "line 4: bad"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.e, got, c.want)
		}
	}
}
