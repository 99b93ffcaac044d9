// Package coordinator lets the ranks of one save agree: gather their local
// plans, share the global plan, and fail together. Local runs N ranks as
// goroutines of one process; a cross-machine implementation satisfies the
// same interface (the saver only exchanges planner and result values).
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// ErrAborted is returned by every pending and later collective call after a
// rank aborted the group.
var ErrAborted = ckpterr.New(ckpterr.Internal, "coordinator: group aborted")

// Coordinator is one rank's handle on the group. Collective calls must be
// made by every rank in the same order.
type Coordinator interface {
	// Rank is this rank's index in [0, WorldSize).
	Rank() int
	// WorldSize is the number of ranks.
	WorldSize() int
	// AllGather contributes v and returns every rank's value, indexed by rank.
	AllGather(ctx context.Context, v any) ([]any, error)
	// Broadcast returns rank 0's v on every rank (other ranks' v is ignored).
	Broadcast(ctx context.Context, v any) (any, error)
	// Abort fails the group: every pending and later collective call on
	// every rank returns an error wrapping ErrAborted and err.
	Abort(err error)
}

// NewLocal returns world coordinators that exchange values in memory, one
// per rank, for ranks running as goroutines in one process.
func NewLocal(world int) []Coordinator {
	if world < 1 {
		world = 1
	}
	g := &group{world: world, cur: newRound(world), aborted: make(chan struct{})}
	out := make([]Coordinator, world)
	for r := range out {
		out[r] = &local{g: g, rank: r}
	}
	return out
}

type round struct {
	done    chan struct{}
	vals    []any
	arrived int
}

func newRound(world int) *round { return &round{done: make(chan struct{}), vals: make([]any, world)} }

type group struct {
	world   int
	mu      sync.Mutex
	cur     *round
	err     error
	aborted chan struct{}
}

type local struct {
	g    *group
	rank int
}

func (l *local) Rank() int      { return l.rank }
func (l *local) WorldSize() int { return l.g.world }

func (l *local) Abort(err error) {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		if err == nil {
			err = errors.New("no reason given")
		}
		g.err = fmt.Errorf("%w by rank %d: %w", ErrAborted, l.rank, err)
		close(g.aborted)
	}
}

func (l *local) AllGather(ctx context.Context, v any) ([]any, error) {
	g := l.g
	g.mu.Lock()
	if g.err != nil {
		err := g.err
		g.mu.Unlock()
		return nil, err
	}
	r := g.cur
	r.vals[l.rank] = v
	r.arrived++
	if r.arrived == g.world {
		g.cur = newRound(g.world)
		close(r.done)
		g.mu.Unlock()
		return r.vals, nil
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.vals, nil
	case <-g.aborted:
		g.mu.Lock()
		defer g.mu.Unlock()
		return nil, g.err
	case <-ctx.Done():
		l.Abort(ctx.Err())
		return nil, fmt.Errorf("rank %d waiting for the other ranks: %w", l.rank, ctx.Err())
	}
}

func (l *local) Broadcast(ctx context.Context, v any) (any, error) {
	vals, err := l.AllGather(ctx, v)
	if err != nil {
		return nil, err
	}
	return vals[0], nil
}
