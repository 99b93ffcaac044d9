package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	ckrun "github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/transfer"
)

// openTiers opens --local: the tiered run of the local tier in front of
// store, and the store saves commit to. Without --local it returns nil and
// store.
func openTiers(ctx context.Context, store *backend.Store, f trainFlags) (*ckrun.Tiered, *backend.Store, error) {
	if f.local == "" {
		if f.persistEvery != 0 || f.localKeep != 2 {
			return nil, nil, usage(fmt.Errorf("--persist-every and --local-keep need --local"))
		}
		return nil, store, nil
	}
	if f.persistEvery < 0 || f.localKeep < 1 {
		return nil, nil, usage(fmt.Errorf("--persist-every must be >= 0 and --local-keep >= 1"))
	}
	local, err := openStore(ctx, f.local)
	if err != nil {
		return nil, nil, err
	}
	t := ckrun.NewTiered(ckrun.New(local), ckrun.New(store), ckrun.TierOptions{PersistEvery: f.persistEvery, LocalKeep: f.localKeep, Transfer: transfer.Options{}})
	return t, local, nil
}

// persistReport is the "persist" object of `ckpt train --json` with --local.
type persistReport struct {
	// Local is the local tier's URL; Every is --persist-every.
	Local string `json:"local"`
	Every int64  `json:"every"`
	// Persisted lists the steps committed in RUN_URL by this run; Failed
	// counts the persists that failed, Failures says why; Superseded the
	// queued steps a newer one replaced.
	Persisted  []int64  `json:"persisted"`
	Failed     int      `json:"failed"`
	Failures   []string `json:"failures"`
	Superseded int      `json:"superseded"`
	// Bytes and Seconds total the persists' copies; InFlight names a step
	// whose persist had not ended when the run did (-1: none).
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	InFlight int64   `json:"in_flight"`
}

// persisted logs the persists that ended (a failure is said, never
// dropped: it is also counted in --json and fails the run at its end).
func (c *checkpointer) persisted(ended []ckrun.Persist) {
	for _, p := range ended {
		if p.Err != nil {
			c.logf("warning: %v (the step stays in the local tier)", p.Err)
			continue
		}
		c.logf("step %d: persisted to %s (%d bytes, %s)", p.Step, p.Result.Destination, p.Result.Bytes, p.Result.Duration.Round(time.Millisecond))
	}
}

// waitPersist waits, for at most grace, for the in-flight persist.
func (c *checkpointer) waitPersist(ctx context.Context, grace time.Duration) error {
	if c.tiered == nil {
		return nil
	}
	ended, err := c.tiered.Wait(ctx, grace)
	c.persisted(ended)
	return err
}

// persistReport sums the tiered run's persists (nil without --local).
func (c *checkpointer) persistReport() *persistReport {
	if c.tiered == nil {
		return nil
	}
	st := c.tiered.Stats()
	r := &persistReport{Local: c.run.String(), Every: c.f.persistEvery, Persisted: []int64{}, Failures: []string{}, Superseded: st.Superseded, InFlight: -1}
	for _, p := range st.Persists {
		if p.Err != nil {
			r.Failed++
			r.Failures = append(r.Failures, p.Err.Error())
			continue
		}
		r.Persisted = append(r.Persisted, p.Step)
		r.Bytes += p.Result.Bytes
		r.Seconds += p.Result.Duration.Seconds()
	}
	r.InFlight = st.InFlight
	return r
}

// lastPersistErr is the newest failed persist's error (nil: none failed).
func (c *checkpointer) lastPersistErr() error {
	var err error
	for _, p := range c.tiered.Stats().Persists {
		if p.Err != nil {
			err = p.Err
		}
	}
	return err
}
