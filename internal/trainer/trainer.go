// Package trainer is the small, real, fully deterministic model that the
// `ckpt train` command trains and checkpoints: a float32 MLP with a
// two-expert mixture-of-experts layer, trained with AdamW (lazily created
// per-parameter state, like PyTorch) under a StepLR scheduler.
//
// Model (per sample x in R^8):
//
//	h1 = embed(x)            embed.weight [16,8], embed.bias [16]
//	a1 = relu(h1)
//	n  = norm.weight*a1 + norm.bias   (per-feature affine, [16] each)
//	h2 = experts.k(n)        experts.{0,1}.weight [16,16], .bias [16]
//	a2 = relu(h2)
//	y  = head(a2)            head.weight [1,16], head.bias [1]
//
// Routing is hard and deterministic: training steps 1..7 (Iteration() 0..6
// before the step) send every sample to expert 0, so expert 1 receives no
// gradient and has no optimizer state; from step 8 on, a sample goes to
// expert 1 when its first input feature is >= 0, else to expert 0.
//
// The loss is the mean squared error against a fixed random teacher
// y* = a.x + sum_j c_j x_j x_(j+1), whose coefficients come from the seed.
//
// Determinism: all randomness comes from math/rand/v2's PCG (PCG-DXSM, a
// specified algorithm) seeded with (seed, stream constant) for parameters
// and the teacher, and with (seed, step) for each batch, so a batch depends
// only on the seed and the step number and no data-loader state is needed.
// Floats are derived from the raw 64-bit outputs by this package (not by
// the rand helpers). Every sum runs in a fixed order on one goroutine, and
// every product is rounded explicitly (float32(a*b)) so the compiler may not
// fuse multiply-adds: the same seed gives bit-identical weights on every run
// and architecture.
package trainer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"unsafe"
)

// Model dimensions and training constants.
const (
	// InDim is the input width.
	InDim = 8
	// Hidden is the width of the embedding, norm and experts.
	Hidden = 16
	// NumExperts is the number of experts.
	NumExperts = 2
	// BatchSize is the number of samples per training step.
	BatchSize = 32
	// RouteAllStep is the first training step (1-based) at which samples
	// may be routed to expert 1; before it everything goes to expert 0.
	RouteAllStep = 8
)

// PCG stream constants (second PCG seed word) for each random source.
const (
	streamInit    = 0x696e6974 // "init"
	streamTeacher = 0x74656163 // "teac"
	streamBatch   = 0x62617463 // "batc"; the step number is mixed in
	streamBallast = 0x62616c6c // "ball"
)

// The ballast scales the state (NewSized): a [rows, BallastWidth] float32
// parameter BallastName, trained on the penalty BallastPenalty/2 * |w|^2
// alone (gradient BallastPenalty * w, dense), so it never touches the
// model's output or loss, and every element of it and of its AdamW state
// changes at every step.
const (
	BallastName    = "ballast.weight"
	BallastWidth   = 1024
	BallastPenalty = 0.5
)

// param is one trainable parameter and its gradient for the current step.
type param struct {
	name    string
	shape   []int64
	data    []float32
	grad    []float32
	hasGrad bool // whether the current step produced a gradient (torch: grad is not None)
}

// Trainer holds the model, the optimizer, the scheduler and the iteration.
type Trainer struct {
	seed      uint64
	params    []*param // sorted by name
	byName    map[string]*param
	teacherA  []float32
	teacherC  []float32
	opt       *adamW
	sched     *stepLR
	iteration int64
	loss      float32
	pending   float32 // the batch loss of the step Backward computed
}

// New returns a freshly initialised trainer. Linear weights and biases are
// uniform in [-1/sqrt(in), 1/sqrt(in)) (like PyTorch's default), the norm
// scale is 1 and its shift 0; all drawn from PCG(seed, "init") in the order
// embed, experts.0, experts.1, head (weight then bias).
func New(seed uint64) *Trainer { return NewSized(seed, 0) }

// BallastRows is the number of ballast rows NewSized adds for a state of
// about stateBytes bytes: parameter, exp_avg and exp_avg_sq take 12 bytes
// per element. 0 for stateBytes below one row's state.
func BallastRows(stateBytes int64) int64 { return stateBytes / (12 * BallastWidth) }

// NewSized is New with a ballast parameter of BallastRows(stateBytes) rows
// (none for 0), uniform in [-1, 1) from PCG(seed, "ball"), so that a
// checkpoint with optimizer state is about stateBytes bytes. The model's
// own parameters, batches and losses are those of New(seed).
func NewSized(seed uint64, stateBytes int64) *Trainer {
	t := &Trainer{seed: seed, byName: map[string]*param{}, opt: newAdamW(), sched: newStepLR()}
	t.opt.lr = t.sched.lr()
	rng := rand.NewPCG(seed, streamInit)
	linear := func(name string, out, in int) {
		bound := float32(1 / math.Sqrt(float64(in)))
		w := t.add(name+".weight", int64(out), int64(in))
		b := t.add(name+".bias", int64(out))
		for i := range w.data {
			w.data[i] = float32(uniform(rng) * bound)
		}
		for i := range b.data {
			b.data[i] = float32(uniform(rng) * bound)
		}
	}
	linear("embed", Hidden, InDim)
	nw := t.add("norm.weight", Hidden)
	for i := range nw.data {
		nw.data[i] = 1
	}
	t.add("norm.bias", Hidden)
	for e := range NumExperts {
		linear("experts."+string(rune('0'+e)), Hidden, Hidden)
	}
	linear("head", 1, Hidden)
	if rows := BallastRows(stateBytes); rows > 0 {
		b := t.add(BallastName, rows, BallastWidth)
		brng := rand.NewPCG(seed, streamBallast)
		for i := range b.data {
			b.data[i] = uniform(brng)
		}
	}
	sort.Slice(t.params, func(i, j int) bool { return t.params[i].name < t.params[j].name })

	trng := rand.NewPCG(seed, streamTeacher)
	t.teacherA = make([]float32, InDim)
	t.teacherC = make([]float32, InDim-1)
	for i := range t.teacherA {
		t.teacherA[i] = uniform(trng)
	}
	for i := range t.teacherC {
		t.teacherC[i] = uniform(trng)
	}
	return t
}

func (t *Trainer) add(name string, shape ...int64) *param {
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	p := &param{name: name, shape: shape, data: make([]float32, n), grad: make([]float32, n)}
	t.params = append(t.params, p)
	t.byName[name] = p
	return p
}

// uniform returns a float32 uniform in [-1, 1) with 24 random bits; it is
// exact (no rounding) and independent of math/rand's float helpers.
func uniform(src *rand.PCG) float32 {
	return float32(src.Uint64()>>40)/(1<<23) - 1
}

// Batch returns the inputs and teacher targets of training step `step`
// (1-based). It depends only on the seed and step.
func (t *Trainer) Batch(step int64) (xs [][InDim]float32, ys []float32) {
	rng := rand.NewPCG(t.seed, streamBatch^(uint64(step)*0x9e3779b97f4a7c15))
	xs = make([][InDim]float32, BatchSize)
	ys = make([]float32, BatchSize)
	for s := range xs {
		for j := range xs[s] {
			xs[s][j] = uniform(rng)
		}
		var y float32
		for j := range InDim {
			y += float32(t.teacherA[j] * xs[s][j])
		}
		for j := range InDim - 1 {
			y += float32(t.teacherC[j] * float32(xs[s][j]*xs[s][j+1]))
		}
		ys[s] = y
	}
	return xs, ys
}

// route returns the expert for sample x at training step `step` (1-based).
func route(step int64, x *[InDim]float32) int {
	if step < RouteAllStep || x[0] < 0 {
		return 0
	}
	return 1
}

// linear computes out = W in + b for W [len(out), len(in)], in fixed order.
func linear(w, b, in, out []float32) {
	for i := range out {
		s := b[i]
		row := w[i*len(in) : (i+1)*len(in)]
		for j, v := range in {
			s += float32(row[j] * v)
		}
		out[i] = s
	}
}

// acts holds one sample's intermediate activations.
type acts struct {
	h1, a1, n, h2, a2 [Hidden]float32
}

// forward returns the model output for x through expert k, recording the
// activations in c.
func (t *Trainer) forward(x *[InDim]float32, k int, c *acts) float32 {
	p := t.byName
	nw, nb := p["norm.weight"], p["norm.bias"]
	linear(p["embed.weight"].data, p["embed.bias"].data, x[:], c.h1[:])
	for i := range Hidden {
		c.a1[i] = max(c.h1[i], 0)
		c.n[i] = float32(nw.data[i]*c.a1[i]) + nb.data[i]
	}
	linear(p[expertName(k)+".weight"].data, p[expertName(k)+".bias"].data, c.n[:], c.h2[:])
	for i := range Hidden {
		c.a2[i] = max(c.h2[i], 0)
	}
	var y [1]float32
	linear(p["head.weight"].data, p["head.bias"].data, c.a2[:], y[:])
	return y[0]
}

// EvalLoss is the MSE on a fixed held-out batch (the batch of step 0,
// which training never uses), routed as the next training step would
// route. It changes nothing.
func (t *Trainer) EvalLoss() float32 {
	xs, ys := t.Batch(0)
	var c acts
	var loss float32
	for s := range xs {
		diff := t.forward(&xs[s], route(t.iteration+1, &xs[s]), &c) - ys[s]
		loss += float32(diff * diff)
	}
	return loss / BatchSize
}

// Step runs one training step (forward, backward, AdamW step, scheduler
// step, iteration++) and returns the batch loss computed before the update:
// Backward then Update.
func (t *Trainer) Step() float32 {
	t.Backward()
	return t.Update()
}

// Backward runs the forward and backward pass of the next step: it fills
// the gradients (and the batch loss) and reads, but never writes, the
// weights and the optimizer state, so a save may still be reading them
// (staging overlapped with compute). Update applies the step.
func (t *Trainer) Backward() {
	step := t.iteration + 1
	xs, ys := t.Batch(step)
	for _, p := range t.params {
		if p.name != BallastName { // its gradient is overwritten below
			clear(p.grad)
		}
		p.hasGrad = false
	}
	p := t.byName
	ew, eb, nw, nb := p["embed.weight"], p["embed.bias"], p["norm.weight"], p["norm.bias"]
	hw, hb := p["head.weight"], p["head.bias"]
	var c acts
	var dh2, dn, dh1 [Hidden]float32
	var loss float32
	for s := range xs {
		x := &xs[s]
		k := route(step, x)
		xw, xb := p[expertName(k)+".weight"], p[expertName(k)+".bias"]
		h1, a1, n, h2, a2 := &c.h1, &c.a1, &c.n, &c.h2, &c.a2
		diff := t.forward(x, k, &c) - ys[s]
		loss += float32(diff * diff)
		// Backward of mean((y - y*)^2).
		dy := float32(2*diff) / BatchSize
		hb.grad[0] += dy
		for i := range Hidden {
			hw.grad[i] += float32(dy * a2[i])
			dh2[i] = 0
			if h2[i] > 0 {
				dh2[i] = float32(dy * hw.data[i])
			}
		}
		dn = [Hidden]float32{}
		for i := range Hidden {
			xb.grad[i] += dh2[i]
			row := xw.data[i*Hidden : (i+1)*Hidden]
			grow := xw.grad[i*Hidden : (i+1)*Hidden]
			for j := range Hidden {
				grow[j] += float32(dh2[i] * n[j])
				dn[j] += float32(row[j] * dh2[i])
			}
		}
		for i := range Hidden {
			nw.grad[i] += float32(dn[i] * a1[i])
			nb.grad[i] += dn[i]
			dh1[i] = 0
			if h1[i] > 0 {
				dh1[i] = float32(dn[i] * nw.data[i])
			}
		}
		for i := range Hidden {
			eb.grad[i] += dh1[i]
			grow := ew.grad[i*InDim : (i+1)*InDim]
			for j := range InDim {
				grow[j] += float32(dh1[i] * x[j])
			}
		}
		xw.hasGrad, xb.hasGrad = true, true
	}
	for _, q := range []*param{ew, eb, nw, nb, hw, hb} {
		q.hasGrad = true
	}
	if b := p[BallastName]; b != nil {
		for i, v := range b.data {
			b.grad[i] = float32(BallastPenalty * v)
		}
		b.hasGrad = true
	}
	t.pending = loss / BatchSize
}

// Update applies the step whose gradients Backward computed (AdamW step,
// scheduler step, iteration++), the only part of a step that writes the
// saved state, and returns that step's batch loss.
func (t *Trainer) Update() float32 {
	t.opt.step(t.params)
	t.sched.step()
	t.opt.lr = t.sched.lr()
	t.iteration++
	t.loss = t.pending
	return t.loss
}

func expertName(k int) string { return "experts." + string(rune('0'+k)) }

// Iteration is the number of training steps taken so far.
func (t *Trainer) Iteration() int64 { return t.iteration }

// LR is the learning rate the next step will use.
func (t *Trainer) LR() float64 { return t.opt.lr }

// Loss is the loss of the last step (0 before the first step or right
// after a Restore).
func (t *Trainer) Loss() float32 { return t.loss }

// Seed is the seed the trainer was created with.
func (t *Trainer) Seed() uint64 { return t.seed }

// WeightsSHA256 is the hex SHA-256 over every parameter's float32
// little-endian bytes, parameters in sorted fqn order.
func (t *Trainer) WeightsSHA256() string {
	h := sha256.New()
	for _, p := range t.params {
		h.Write(f32View(p.data))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ParamNames returns every parameter fqn, sorted.
func (t *Trainer) ParamNames() []string {
	out := make([]string, len(t.params))
	for i, p := range t.params {
		out[i] = p.name
	}
	return out
}

// Trainable returns the fqns of the trainable parameters, sorted (all of
// them: the model has no frozen parameters).
func (t *Trainer) Trainable() []string { return t.ParamNames() }

// ParamShape returns a parameter's shape, or nil for an unknown fqn.
func (t *Trainer) ParamShape(fqn string) []int64 {
	if p, ok := t.byName[fqn]; ok {
		return slices.Clone(p.shape)
	}
	return nil
}

// OptimizerSlots returns AdamW's per-parameter slot names.
func (t *Trainer) OptimizerSlots() []string { return slices.Clone(adamSlots) }

// HasOptimizerState reports whether parameter fqn has optimizer state.
func (t *Trainer) HasOptimizerState(fqn string) bool {
	_, ok := t.opt.state[fqn]
	return ok
}

// PrunedOptimizerParams returns the sorted fqns of trainable parameters
// that have no optimizer state yet (they never received a gradient).
func (t *Trainer) PrunedOptimizerParams() []string {
	var out []string
	for _, p := range t.params {
		if !t.HasOptimizerState(p.name) {
			out = append(out, p.name)
		}
	}
	return out
}

// littleEndian is whether float32 memory already is its little-endian
// encoding.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// f32View returns v's little-endian bytes: v's own memory on little-endian
// hosts, a copy elsewhere.
func f32View(v []float32) []byte {
	if !littleEndian {
		return f32Bytes(v)
	}
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// f32Bytes encodes v as little-endian bytes (a copy).
func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}
