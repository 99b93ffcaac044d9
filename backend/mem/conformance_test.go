package mem_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// TestMain prints this backend's conformance rows after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

var bucketSeq atomic.Int64

// TestConformance runs the whole suite on a fresh named bucket per case,
// below a URL prefix so that driver keys differ from store keys.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{Name: "mem", NewStore: func(t conformance.T) *backend.Store {
		name := fmt.Sprintf("conf-%d", bucketSeq.Add(1))
		t.Cleanup(func() { mem.Reset(name) })
		return storetest.Open(t, "mem://"+name+"/run/7")
	}})
}
