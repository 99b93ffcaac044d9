package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
)

// schemaVersion is the version of the --json schema (docs/CLI.md). It is
// bumped when a member changes meaning or disappears; new members do not
// bump it.
const schemaVersion = 1

// jsonHelp is the help of every command's --json flag.
const jsonHelp = "print one JSON document on stdout (schema: docs/CLI.md), errors included"

// header is the part every --json document shares; every output type
// embeds it.
type header struct {
	SchemaVersion int        `json:"schema_version"`
	Command       string     `json:"command"`
	Error         *errorJSON `json:"error,omitempty"`
}

func (h *header) head() *header { return h }

// document is a --json output: a struct embedding header.
type document interface{ head() *header }

// errorJSON is the error object of a --json document.
type errorJSON struct {
	Class   string `json:"class"`
	Message string `json:"message"`
	URL     string `json:"url,omitempty"`
}

// errorDoc is the document of a command that failed before it had a result.
type errorDoc struct {
	header
}

// emit records doc as the command's --json result; run writes it on
// stdout when the command returns, with the error object set if it failed.
func emit(cmd *cobra.Command, doc document) {
	inv(cmd).doc = doc
}

// writeDocument writes the document of command name (and its error) on w.
func writeDocument(w io.Writer, name string, doc document, err error, args []string) error {
	if doc == nil {
		doc = &errorDoc{}
	}
	h := doc.head()
	h.SchemaVersion, h.Command = schemaVersion, name
	if err != nil {
		h.Error = &errorJSON{Class: ckpterr.ClassOf(err).String(), Message: err.Error(), URL: errorURL(err, args)}
	}
	return writeJSON(w, doc)
}

// errorURL is the URL an error is about: the storage error's object or
// prefix when there is one, else the command's first URL argument.
func errorURL(err error, args []string) string {
	var be *backend.Error
	if errors.As(err, &be) && be.URL != "" {
		return be.URL
	}
	var pe *pathError
	if errors.As(err, &pe) {
		return pe.url
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return backend.RedactURL(a)
		}
	}
	return ""
}

func writeJSON(w io.Writer, v any) error {
	if s, ok := v.(streamedDocument); ok {
		return s.streamJSON(w)
	}
	return encodeJSON(w, v)
}

// streamedDocument is a document that writes its own JSON, as encodeJSON
// would, without holding all of it in memory (ckpt inspect).
type streamedDocument interface {
	streamJSON(w io.Writer) error
}

// encodeJSON writes v as one line of JSON, without HTML escaping.
func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// wantsJSON reports whether the command line asked c for --json output.
func wantsJSON(c *cobra.Command) bool {
	if c == nil {
		return false
	}
	f := c.Flags().Lookup("json")
	return f != nil && f.Value.String() == "true"
}

// safe makes s harmless to print on a terminal: control characters (C0,
// DEL, C1: escape sequences, carriage returns, backspaces), Unicode
// format characters that reorder or hide text (bidi overrides and
// isolates, zero-width marks) and invalid UTF-8 are replaced by Go escapes
// (\x1b, \u202e, \xff). Every command's human output passes the keys, URLs,
// reasons and messages it prints through safe; --json output needs no such
// step (JSON escapes control characters, and a reader decodes it).
func safe(s string) string {
	clean := true
	for _, r := range s {
		if unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// safeAll applies safe to every string of ss.
func safeAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = safe(s)
	}
	return out
}

// unsafeRune reports whether r must not reach a terminal as is.
func unsafeRune(r rune) bool {
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) ||
		unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r)
}
