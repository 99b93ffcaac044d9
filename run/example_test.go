package run_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// A run with a node-local tier: every save commits locally, every second
// step is persisted to the durable run in the background, and a resume
// takes the nearest valid copy (the durable one once the node's local
// directory is gone).
func ExampleNewTiered() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ckptkit-tiers")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	local, err := run.Open(ctx, filepath.Join(dir, "node-local")) // /dev/shm/job7 or a local SSD
	if err != nil {
		log.Fatal(err)
	}
	durable, err := run.Open(ctx, filepath.Join(dir, "durable")) // s3://bucket/job7 alike
	if err != nil {
		log.Fatal(err)
	}
	t := run.NewTiered(local, durable, run.TierOptions{PersistEvery: 2})
	defer t.Close(0)

	state := func(v byte) []*statedict.StateDict {
		sd := statedict.New()
		sd.Tensors["model.w"] = statedict.Whole(&statedict.Tensor{DType: statedict.Uint8, Shape: []int64{4}, Data: []byte{v, v, v, v}})
		return []*statedict.StateDict{sd}
	}
	for step := int64(1); step <= 3; step++ {
		_, ended, err := t.SaveLocal(ctx, step, state(byte(step)), saver.Options{})
		if err != nil {
			log.Fatal(err)
		}
		for _, p := range ended { // persists that ended since the last save
			if p.Err != nil {
				log.Fatal(p.Err)
			}
		}
	}
	if _, err := t.Wait(ctx, 0); err != nil { // a job that ends waits for its persist
		log.Fatal(err)
	}

	target := state(0)
	load := run.ResumeOptions{Load: run.Into(func() []*statedict.StateDict { return target }, loader.Options{})}
	res, err := t.ResumeTiered(ctx, load)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Tier, res.Entry.Name, target[0].Tensors["model.w"].Data)

	// The node is lost: its local tier is gone.
	if err := os.RemoveAll(filepath.Join(dir, "node-local")); err != nil {
		log.Fatal(err)
	}
	res, err = t.ResumeTiered(ctx, load)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Tier, res.Entry.Name, target[0].Tensors["model.w"].Data)
	// Output:
	// local step-00000003 [3 3 3 3]
	// durable step-00000002 [2 2 2 2]
}
