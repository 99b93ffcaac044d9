package main

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"

	"github.com/ckptkit/ckptkit/catalog"
	ckrun "github.com/ckptkit/ckptkit/run"
)

// runLayout is a run's layout as package run owns it, for a caller that
// must not rebuild it (Python's save and resume).
type runLayout struct {
	// StepName and StepURL name step's checkpoint under the run.
	StepName string `json:"step_name"`
	StepURL  string `json:"step_url"`
	// CoordURL is where ranks coordinating through the store keep their
	// rounds (run.CoordPrefix under the run).
	CoordURL string `json:"coord_url"`
}

// ckpt_run_layout writes to *out the JSON {step_name, step_url, coord_url}
// of step (>= 0) under the run URL url, its query kept.
//
//export ckpt_run_layout
func ckpt_run_layout(url *C.char, step C.int64_t, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_run_layout", cls, rule, msg, func() error {
		if step < 0 {
			return fmt.Errorf("%w: step %d is negative", errUsage, int64(step))
		}
		u, name := C.GoString(url), catalog.StepName(int64(step))
		return setJSON(out, runLayout{StepName: name, StepURL: ckrun.URLIn(u, name), CoordURL: ckrun.URLIn(u, ckrun.CoordPrefix)})
	})
}
