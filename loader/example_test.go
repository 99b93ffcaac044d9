package loader_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// Two ranks save a row-sharded weight and the state of an optimizer that
// has seen only one of two parameters; one rank resumes from it.
func Example() {
	ctx := context.Background()
	st, err := backend.Open(ctx, "mem://example/run/step-00000010")
	if err != nil {
		panic(err)
	}
	w := statedict.NewTensor(statedict.Float32, 4, 2)
	for i := range w.Data {
		w.Data[i] = byte(i)
	}
	head := statedict.NewTensor(statedict.Float32, 2)
	step := statedict.NewTensor(statedict.Float32)
	ranks := make([]*statedict.StateDict, 2)
	for r := range ranks {
		sd := statedict.New()
		sd.Tensors["model.w"] = statedict.RowShard(w, r, 2)
		sd.Tensors["model.head"] = statedict.Whole(head) // replicated: stored once
		sd.Tensors["optimizer.state.w.step"] = statedict.Whole(step)
		sd.Tensors["optimizer.state.w.exp_avg"] = statedict.RowShard(w, r, 2)
		sd.Tensors["optimizer.state.w.exp_avg_sq"] = statedict.RowShard(w, r, 2)
		sd.Bytes["scheduler.last_epoch"] = []byte("10")
		ranks[r] = sd
	}
	if _, err := saver.SaveLocal(ctx, st, ranks, saver.Options{Iteration: 10}); err != nil {
		panic(err)
	}

	// The resuming job asks for optimizer state of every parameter;
	// "head" never got a gradient, so its state is lazily absent.
	target := statedict.New()
	for _, k := range []string{"model.w", "optimizer.state.w.exp_avg", "optimizer.state.w.exp_avg_sq"} {
		target.Tensors[k] = statedict.Whole(statedict.NewTensor(statedict.Float32, 4, 2))
	}
	target.Tensors["model.head"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 2))
	for _, p := range []string{"w", "head"} {
		target.Tensors["optimizer.state."+p+".step"] = statedict.Whole(statedict.NewTensor(statedict.Float32))
	}
	target.Tensors["optimizer.state.head.exp_avg"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 2))
	target.Tensors["optimizer.state.head.exp_avg_sq"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 2))
	target.Bytes["scheduler.last_epoch"] = nil

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: quiet})
	if err != nil {
		panic(err)
	}
	fmt.Println("iteration", rep.Iteration, "lazy", rep.LazyParams)
	fmt.Println("w row 3:", target.Tensors["model.w"].Data[24:32])
	fmt.Println("scheduler:", string(target.Bytes["scheduler.last_epoch"]))
	// Output:
	// iteration 10 lazy [head]
	// w row 3: [24 25 26 27 28 29 30 31]
	// scheduler: 10
}
