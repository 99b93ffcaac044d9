package readme_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs" // registers local paths and file://; import backend/s3, backend/gcs for s3://, gs://
	"github.com/ckptkit/ckptkit/loader"
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

	// Storage is chosen by URL: a local path here, s3://bucket/run/step-00000100 alike.
	st, err := backend.Open(ctx, dir+"/run/step-00000100")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	// One rank's state: tensors under model.<name> (optimizer.state.<name>.<slot>, scheduler.<field>, ...).
	w := make([]byte, 4*3)
	for i, v := range []float32{0.5, -1, 2} {
		binary.LittleEndian.PutUint32(w[4*i:], math.Float32bits(v))
	}
	sd := statedict.New()
	sd.Tensors["model.linear.weight"] = statedict.Whole(&statedict.Tensor{DType: statedict.Float32, Shape: []int64{3}, Data: w})
	if _, err := saver.SaveLocal(ctx, st, []*statedict.StateDict{sd}, saver.Options{Iteration: 100}); err != nil {
		log.Fatal(err)
	}

	// Before resuming: is it complete, and is every byte intact?
	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("resumable:", vr.Resumable, "iteration:", vr.Iteration)

	// Read it back (any world size can: the loader reassembles shards).
	c, err := loader.Open(ctx, st)
	if err != nil {
		log.Fatal(err)
	}
	t, err := c.ReadTensor(ctx, "model.linear.weight")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.DType, t.Shape, math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4:])))
	// Output:
	// resumable: true iteration: 100
	// float32 [3] -1
}
