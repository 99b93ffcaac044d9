package conformance_test

import (
	"context"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
)

// A backend author's whole conformance test: a fresh, empty store per case,
// and known deviations declared as data.
func ExampleRun() {
	_ = func(t *testing.T) {
		conformance.Run(t, conformance.Harness{
			Name: "mystore",
			NewStore: func(t conformance.T) *backend.Store {
				st, err := backend.Open(context.Background(), "mystore://bucket/"+t.Name())
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				t.Cleanup(func() { st.Close() })
				return st
			},
			Skip: map[string]string{"storage/create-if-absent": "mystore has no conditional writes"},
		})
	}
}
