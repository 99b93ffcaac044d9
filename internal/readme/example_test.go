package readme_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"os"

	_ "github.com/ckptkit/ckptkit/backend/fs" // registers local paths and file://; import backend/s3, backend/gcs for s3://, gs://
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ckptkit-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// Storage is chosen by URL: a local path here, s3://bucket/run7 alike.
	r, err := run.Open(ctx, dir+"/run7")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	// One rank's state: tensors under model.<name> (optimizer.state.<name>.<slot>, scheduler.<field>, ...).
	w := make([]byte, 4*3)
	for i, v := range []float32{0.5, -1, 2} {
		binary.LittleEndian.PutUint32(w[4*i:], math.Float32bits(v))
	}
	sd := statedict.New()
	sd.Tensors["model.linear.weight"] = statedict.Whole(&statedict.Tensor{DType: statedict.Float32, Shape: []int64{3}, Data: w})
	if _, err := r.SaveLocal(ctx, 100, []*statedict.StateDict{sd}, saver.Options{}); err != nil { // run7/step-00000100/
		log.Fatal(err)
	}

	// A restarted job resumes in one call: the newest valid checkpoint,
	// falling back past damaged data, refusing (never restarting) when
	// committed checkpoints exist but none is valid.
	target := statedict.New()
	target.Tensors["model.linear.weight"] = &statedict.Shard{DType: statedict.Float32, GlobalShape: []int64{3}, Offsets: []int64{0}, Sizes: []int64{3}, Data: make([]byte, 4*3)}
	res, err := r.Resume(ctx, run.ResumeOptions{Load: run.Into(func() []*statedict.StateDict { return []*statedict.StateDict{target} }, loader.Options{})})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("fresh:", res.Fresh, "step:", res.Report.Iteration, "checkpoint:", res.Entry.Name)
	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(target.Tensors["model.linear.weight"].Data[4:])))
	// Output:
	// fresh: false step: 100 checkpoint: step-00000100
	// -1
}
