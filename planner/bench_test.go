package planner

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/metadata"
)

// benchSizes are the item/chunk counts benchmarked; 1M only without -short.
func benchSizes() []int {
	if testing.Short() {
		return []int{10_000, 100_000}
	}
	return []int{10_000, 100_000, 1_000_000}
}

// benchPlans builds n items over 16 ranks: half the keys row-sharded over
// all ranks, half replicated on all ranks.
func benchPlans(n int) []LocalPlan {
	const world = 16
	keys := n / world
	plans := make([]LocalPlan, world)
	for r := range world {
		plans[r] = LocalPlan{Rank: r, Items: make([]SaveItem, 0, keys)}
		for k := range keys {
			key := fmt.Sprintf("model.layers.%d.weight", k)
			if k%2 == 0 {
				plans[r].Items = append(plans[r].Items, rowItem(key, "float32", ints(64, 32), r, world))
			} else {
				plans[r].Items = append(plans[r].Items, wholeItem(key, "float32", ints(32)))
			}
		}
	}
	return plans
}

func BenchmarkPlanSave(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			plans := benchPlans(n)
			cpu, runs := cpuTime(), 0
			for b.Loop() {
				if _, err := PlanSave(plans, SaveOptions{MaxObjectBytes: 1 << 20}); err != nil {
					b.Fatal(err)
				}
				runs++
			}
			// CPU time (garbage collection included) is steadier than wall
			// time on a shared machine.
			b.ReportMetric(float64(cpuTime()-cpu)/float64(runs), "cpu-ns/op")
		})
	}
}

func BenchmarkCheckCoverage(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("rows/chunks=%d", n), func(b *testing.B) {
			te := entry(ints(int64(2*n), 8), gridChunks(ints(int64(2*n), 8), []int{n, 1})...)
			for b.Loop() {
				if err := CheckCoverage(te); err != nil {
					b.Fatal(err)
				}
			}
		})
		side := 1
		for side*side < n {
			side++
		}
		b.Run(fmt.Sprintf("grid/chunks=%d", side*side), func(b *testing.B) {
			shape := ints(int64(3*side), int64(2*side))
			te := entry(shape, gridChunks(shape, []int{side, side})...)
			for b.Loop() {
				if err := CheckCoverage(te); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchLoadMetadata is n row chunks: n/1000 tensors of [4000, 16] float32,
// each saved as 1000 row chunks by 1000 ranks (one object per rank).
func benchLoadMetadata(n int) *metadata.Checkpoint {
	const per = 1000
	tensors := n / per
	md := &metadata.Checkpoint{Format: metadata.FormatName, Version: metadata.VersionString(), Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone}}
	objSize := make([]int64, per)
	for t := range tensors {
		te := metadata.TensorEntry{Key: fmt.Sprintf("model.layers.%06d.weight", t), DType: "float32", Shape: ints(4*per, 16)}
		for c := range per {
			ch := metadata.Chunk{Offsets: ints(int64(4*c), 0), Sizes: ints(4, 16), Object: fmt.Sprintf("rank-%05d-000.data", c), Offset: objSize[c], Length: 4 * 16 * 4}
			objSize[c] += ch.Length
			te.Chunks = append(te.Chunks, ch)
		}
		md.Tensors = append(md.Tensors, te)
	}
	for c := range per {
		md.Objects = append(md.Objects, metadata.ObjectEntry{Key: fmt.Sprintf("rank-%05d-000.data", c), Size: objSize[c]})
	}
	return md
}

func BenchmarkPlanLoad(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			md := benchLoadMetadata(n)
			// Reshard 1000 -> 3 ranks: all three ranks' requests.
			var reqs []ReadRequest
			for _, te := range md.Tensors {
				for r := range 3 {
					reqs = append(reqs, rowRequest(te.Key, te.DType, te.Shape, r, 3))
				}
			}
			b.ResetTimer()
			for b.Loop() {
				lp, err := PlanLoad(md, reqs, LoadOptions{MaxGapBytes: 4096})
				if err != nil {
					b.Fatal(err)
				}
				if lp.BytesRead != lp.BytesNeeded {
					b.Fatalf("read %d, needed %d", lp.BytesRead, lp.BytesNeeded)
				}
			}
		})
	}
}

// cpuTime returns the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
