package keys_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/keys"
)

func TestValidate(t *testing.T) {
	for _, k := range []string{"a", "a/b", "step-00000001/.metadata", "ü/ß", "a.b/..c"} {
		assert.NoError(t, keys.Validate(k), k)
	}
	for _, k := range []string{"", "/a", `\a`, "a//b", "a/", "./a", "a/./b", "..", "a/../b", "a\x00b", "\xff", "\xed\xa0\x80"} {
		err := keys.Validate(k)
		assert.ErrorIs(t, err, keys.ErrInvalidKey, "%q", k)
		assert.Equal(t, ckpterr.Usage, ckpterr.ClassOf(err), "%q", k)
	}
}
