// Package keys is the one definition of what a valid object key is: the
// syntax every backend, the metadata codec and the DCP reader apply to a key
// before any storage sees it. It is a leaf: it imports only the error
// taxonomy.
package keys

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// ErrInvalidKey: the key is empty, not valid UTF-8, absolute, holds NUL or has
// an empty, "." or ".." segment (an attempt to escape its prefix).
// backend.ErrInvalidKey is this sentinel.
var ErrInvalidKey = ckpterr.New(ckpterr.Usage, "invalid object key")

// Validate checks that key is a clean relative slash-separated key: valid
// UTF-8 (object stores and file systems name objects by Unicode text), not
// empty, not absolute, no NUL, no empty, "." or ".." segments. The error
// wraps ErrInvalidKey and quotes the key.
func Validate(key string) error {
	if key == "" {
		return fmt.Errorf("empty key: %w", ErrInvalidKey)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("key %q is not valid UTF-8: %w", key, ErrInvalidKey)
	}
	if strings.ContainsRune(key, 0) {
		return fmt.Errorf("key %q holds a NUL byte: %w", key, ErrInvalidKey)
	}
	if strings.HasPrefix(key, "/") || strings.HasPrefix(key, `\`) {
		return fmt.Errorf("key %q is absolute: %w", key, ErrInvalidKey)
	}
	for _, seg := range strings.Split(key, "/") {
		switch seg {
		case "":
			return fmt.Errorf("key %q has an empty segment: %w", key, ErrInvalidKey)
		case ".", "..":
			return fmt.Errorf("key %q has a %q segment: %w", key, seg, ErrInvalidKey)
		}
	}
	return nil
}
