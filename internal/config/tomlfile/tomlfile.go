// Package tomlfile decodes configuration files in TOML strictly, with positions: an unknown key
// is an error naming its full path and line, a value of the wrong type says what was expected,
// and Index gives the line of any key so that later validation errors can name it too. Every
// role's config (and the lab's topology files) read their files through it.
package tomlfile

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Error is one problem in a topology. File and Line are set when the topology was read from
// a file and locate the offending key; Column is set only for TOML syntax errors. Object names
// what is wrong, e.g. "link r1-core" or "host r1 route 10.2.0.0/16", and Reason says why.
type Error struct {
	File   string
	Line   int
	Column int
	Object string
	Reason string
}

// Error formats e as "file:line:col: object: reason", leaving out the parts that are not set.
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d", e.File, e.Line)
	case e.File != "":
		b.WriteString(e.File)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d", e.Line)
	}
	if e.Line > 0 && e.Column > 0 {
		fmt.Fprintf(&b, ":%d", e.Column)
	}
	for _, s := range []string{e.Object, e.Reason} {
		if s == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(s)
	}
	return b.String()
}

// Decode decodes data (named filename in errors) into v, refusing unknown keys, and returns the
// index of the keys' positions. Errors are *Error values (joined when several).
func Decode(filename string, data []byte, v any) (*Index, error) {
	ix, ixErr := indexKeys(data)
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, decodeError(filename, ix, err)
	}
	if ixErr != nil {
		// Not expected: the decoder parses with the same parser and has just accepted data.
		return nil, &Error{File: filename, Reason: strings.TrimPrefix(ixErr.Error(), "toml: ")}
	}
	return ix, nil
}

var mismatchRE = regexp.MustCompile(`^cannot decode TOML (.+) into struct field \S+ of type (\S+)$`)

// decodeError converts an error of the TOML decoder into *Error values. Syntax errors get a
// column; unknown keys are named by their full path, such as "link[1].ab.bogus".
func decodeError(filename string, ix *Index, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		errs := make([]error, len(strict.Errors))
		for i := range strict.Errors {
			de := &strict.Errors[i]
			line, col := de.Position()
			key, ok := ix.keyAt(line, col)
			if !ok {
				key = strings.Join(de.Key(), ".")
			}
			errs[i] = &Error{File: filename, Line: line, Column: col, Reason: fmt.Sprintf("unknown key %q", key)}
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return &Error{File: filename, Reason: strings.TrimPrefix(err.Error(), "toml: ")}
	}
	line, col := de.Position()
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	if m := mismatchRE.FindStringSubmatch(msg); m != nil {
		// The decoder's message names Go types of this package, which mean nothing to the
		// author of the file.
		msg = fmt.Sprintf("want %s, not %s", goTypeName(m[2]), withArticle(m[1]))
	}
	if key := de.Key(); len(key) > 0 {
		msg = strings.Join(key, ".") + ": " + msg
	}
	return &Error{File: filename, Line: line, Column: col, Reason: msg}
}

func goTypeName(t string) string {
	t = strings.TrimPrefix(t, "*")
	switch {
	case strings.HasPrefix(t, "[]"):
		return "an array of tables"
	case t == "string":
		return "a string"
	case t == "bool":
		return "a boolean"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "an integer"
	}
	return "a table"
}

func withArticle(s string) string {
	if s != "" && strings.ContainsRune("aeiou", rune(s[0])) {
		return "an " + s
	}
	return "a " + s
}

// Index records where each key of a TOML document is. Keys are named by their path from
// the root with array elements indexed, as in "link[2].ab.delay" or "host[0].route[1].via".
type Index struct {
	lines    map[string]int    // path -> line of its first occurrence
	keys     map[[2]int]string // line and column of a key -> its path
	newlines []int             // offsets of '\n' in the document
}

// indexKeys walks the document with the parser of go-toml, tracking the element counts of
// arrays of tables so that the n-th [[link]] header gets path "link[n-1]", as in the decoded
// slice.
func indexKeys(data []byte) (*Index, error) {
	ix := &Index{lines: map[string]int{}, keys: map[[2]int]string{}}
	for i, c := range data {
		if c == '\n' {
			ix.newlines = append(ix.newlines, i)
		}
	}
	counts := map[string]int{} // path of an array of tables -> elements so far
	var p unstable.Parser
	p.Reset(data)
	table := ""
	for p.NextExpression() {
		n := p.Expression()
		switch n.Kind {
		case unstable.Table, unstable.ArrayTable:
			path := ""
			it := n.Key()
			for it.Next() {
				k := it.Node()
				path = joinKey(path, string(k.Data))
				if n.Kind == unstable.ArrayTable && it.IsLast() {
					i := counts[path]
					counts[path] = i + 1
					path = fmt.Sprintf("%s[%d]", path, i)
				} else if c, ok := counts[path]; ok {
					path = fmt.Sprintf("%s[%d]", path, c-1) // the element being filled
				}
				ix.add(path, int(k.Raw.Offset))
			}
			table = path
		case unstable.KeyValue:
			ix.keyValue(table, n)
		}
	}
	return ix, p.Error()
}

func (ix *Index) keyValue(prefix string, n *unstable.Node) {
	path := prefix
	off := 0
	it := n.Key()
	for it.Next() {
		k := it.Node()
		path = joinKey(path, string(k.Data))
		off = int(k.Raw.Offset)
		ix.add(path, off)
	}
	ix.value(path, n.Value(), off)
}

// value indexes the keys inside an inline table or array value; off is the offset of the
// nearest enclosing node that has a position, since arrays themselves have none.
func (ix *Index) value(path string, v *unstable.Node, off int) {
	switch v.Kind {
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if c := it.Node(); c.Kind == unstable.KeyValue {
				ix.keyValue(path, c)
			}
		}
	case unstable.Array:
		i := 0
		it := v.Children()
		for it.Next() {
			c := it.Node()
			if c.Kind == unstable.Comment {
				continue
			}
			elem := fmt.Sprintf("%s[%d]", path, i)
			i++
			o := off
			if c.Raw.Length > 0 {
				o = int(c.Raw.Offset)
			}
			ix.add(elem, o)
			ix.value(elem, c, o)
		}
	}
}

func (ix *Index) add(path string, off int) {
	line, col := ix.position(off)
	if _, ok := ix.lines[path]; !ok {
		ix.lines[path] = line
	}
	ix.keys[[2]int{line, col}] = path
}

// position returns the 1-based line and byte column of offset off.
func (ix *Index) position(off int) (line, col int) {
	n, _ := slices.BinarySearch(ix.newlines, off) // newlines before off
	start := 0
	if n > 0 {
		start = ix.newlines[n-1] + 1
	}
	return n + 1, off - start + 1
}

// Line returns the line of the first of paths present in the document, or else of the
// nearest enclosing key of paths[0], or 0.
func (ix *Index) Line(paths ...string) int {
	for _, p := range paths {
		if l, ok := ix.lines[p]; ok {
			return l
		}
	}
	if len(paths) == 0 {
		return 0
	}
	for p := paths[0]; p != ""; {
		p = p[:max(strings.LastIndexAny(p, ".["), 0)]
		if l, ok := ix.lines[p]; ok {
			return l
		}
	}
	return 0
}

func (ix *Index) keyAt(line, col int) (string, bool) {
	p, ok := ix.keys[[2]int{line, col}]
	return p, ok
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// TypeName names the TOML type of a decoded value, for error messages ("a string").
func TypeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return "a date or time"
}

// NumberText returns a TOML string as is and a TOML number in decimal notation, so that values
// with units may be written either way ("50mbit" or 50000000); ok is false for other types.
func NumberText(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case int64:
		return strconv.FormatInt(v, 10), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}
