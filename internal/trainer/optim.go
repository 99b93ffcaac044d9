package trainer

import (
	"math"

	"github.com/ckptkit/ckptkit/statedict"
)

// AdamW hyperparameters (PyTorch's names and defaults, except weight decay).
const (
	Beta1       = 0.9
	Beta2       = 0.999
	Eps         = 1e-8
	WeightDecay = 0.01
)

// StepLR settings: lr = BaseLR * Gamma^(last_epoch / StepSize).
const (
	BaseLR   = 0.01
	Gamma    = 0.5
	StepSize = 5
)

// Slot names of AdamW's per-parameter state (statedict's key schema).
const (
	SlotStep     = statedict.SlotStep
	SlotExpAvg   = statedict.SlotExpAvg
	SlotExpAvgSq = statedict.SlotExpAvgSq
)

var adamSlots = []string{SlotStep, SlotExpAvg, SlotExpAvgSq}

// adamState is one parameter's AdamW state; step is a float32 scalar like
// PyTorch's 0-dim step tensor.
type adamState struct {
	step     float32
	expAvg   []float32
	expAvgSq []float32
}

// adamW is PyTorch's AdamW (single-tensor path) with one param group.
// Per-parameter state is created lazily on a parameter's first gradient.
type adamW struct {
	lr, beta1, beta2, eps, weightDecay float64
	state                              map[string]*adamState
}

func newAdamW() *adamW {
	return &adamW{beta1: Beta1, beta2: Beta2, eps: Eps, weightDecay: WeightDecay, state: map[string]*adamState{}}
}

// pow returns b^n by repeated multiplication in float64 (no math.Pow, so
// the result does not depend on the platform's Pow implementation).
func pow(b float64, n int64) float64 {
	r := 1.0
	for range n {
		r = float64(r * b)
	}
	return r
}

// step updates every parameter that has a gradient this step; parameters
// without one are skipped entirely (no state created, no decay), as
// PyTorch does for grad None.
func (o *adamW) step(params []*param) {
	for _, p := range params {
		if !p.hasGrad {
			continue
		}
		st := o.state[p.name]
		if st == nil {
			st = &adamState{expAvg: make([]float32, len(p.data)), expAvgSq: make([]float32, len(p.data))}
			o.state[p.name] = st
		}
		st.step++
		n := int64(st.step)
		decay := float32(1 - float64(o.lr*o.weightDecay))
		bc1 := 1 - pow(o.beta1, n)
		bc2 := 1 - pow(o.beta2, n)
		stepSize := float32(o.lr / bc1)
		bc2Sqrt := float32(math.Sqrt(bc2))
		b1, b2 := float32(o.beta1), float32(o.beta2)
		eps := float32(o.eps)
		for i, g := range p.grad {
			p.data[i] = float32(p.data[i] * decay)
			st.expAvg[i] = float32(b1*st.expAvg[i]) + float32((1-b1)*g)
			st.expAvgSq[i] = float32(b2*st.expAvgSq[i]) + float32(float32((1-b2)*g)*g)
			denom := float32(float32(math.Sqrt(float64(st.expAvgSq[i])))/bc2Sqrt) + eps
			p.data[i] -= float32(stepSize * float32(st.expAvg[i]/denom))
		}
	}
}

// stepLR is PyTorch's StepLR in closed form.
type stepLR struct {
	lastEpoch int64
	baseLR    float64
}

func newStepLR() *stepLR { return &stepLR{baseLR: BaseLR} }

func (s *stepLR) step() { s.lastEpoch++ }

// lr is the learning rate for the current epoch.
func (s *stepLR) lr() float64 { return float64(s.baseLR * pow(Gamma, s.lastEpoch/StepSize)) }
