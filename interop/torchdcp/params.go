package torchdcp

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// FillParams sets c.Training.Params, the optimizer's parameter set, and
// c.Training.ParamGroups, each group's parameters, from
// the bytes entries "optimizer.param_groups.<i>.params" (torch >= 2.4
// flattening of an optimizer state dict keyed by parameter name: each is a
// list of fqns). It reports whether the set was found. Groups whose params
// are not all strings (an optimizer state dict keyed by parameter index)
// or that cannot be decoded leave the set unknown, which is not an error:
// readers then fall back to taking every model key for a parameter. A group
// whose pickle names a forbidden global is an error (ErrForbiddenGlobal,
// naming the key), never an unknown set.
func FillParams(c *metadata.Checkpoint, read ItemReader) (bool, error) {
	var params []string
	var groups [][]string
	found := false
	for _, b := range c.Bytes {
		if b.Encoding != EncodingBytes || !statedict.IsParamsKey(b.Key, OptimizerPrefix) {
			continue
		}
		item, err := read(b.Object, b.Offset, b.Length)
		if err != nil {
			return false, fmt.Errorf("read %q: %w", b.Key, err)
		}
		v, err := DecodeValue(item)
		if errors.Is(err, ErrOpaque) || errors.Is(err, ErrMalformed) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("decode %q: %w", b.Key, err)
		}
		list, ok := v.([]any)
		if !ok {
			return false, nil
		}
		group := make([]string, 0, len(list))
		for _, p := range list {
			fqn, ok := p.(string)
			if !ok || fqn == "" {
				return false, nil
			}
			group = append(group, fqn)
		}
		params = append(params, group...)
		groups = append(groups, group)
		found = true
	}
	if !found {
		return false, nil
	}
	c.Training.ParamGroups = groups
	if len(c.Training.ParamSlots) > 0 {
		return true, nil // the census (ApplyIntegrity) names the parameters its slots belong to
	}
	slices.Sort(params)
	c.Training.Params = slices.Compact(params)
	return true, nil
}
