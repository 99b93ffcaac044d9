package backend_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/mem"
)

// Open picks the driver from the URL's scheme; errors classify with
// errors.Is whatever the backend.
func ExampleOpen() {
	ctx := context.Background()
	st, err := backend.Open(ctx, "mem://example-bucket/run7")
	if err != nil {
		panic(err)
	}
	defer st.Close()
	if err := st.PutBytes(ctx, "step-00000001/hello", []byte("hello, checkpoint"), backend.PutOptions{IfNotExists: true}); err != nil {
		panic(err)
	}
	buf := make([]byte, 5)
	if err := st.ReadRange(ctx, "step-00000001/hello", 7, buf); err != nil {
		panic(err)
	}
	fmt.Println(string(buf))

	err = st.PutBytes(ctx, "step-00000001/hello", []byte("again"), backend.PutOptions{IfNotExists: true})
	fmt.Println(errors.Is(err, backend.ErrAlreadyExists))
	_, err = st.Stat(ctx, "step-00000001/missing")
	fmt.Println(errors.Is(err, backend.ErrNotFound))
	_, err = st.Stat(ctx, "../escape")
	fmt.Println(errors.Is(err, backend.ErrInvalidKey))
	_, err = backend.Open(ctx, "nosuch://x")
	fmt.Println(errors.Is(err, backend.ErrUnknownScheme))
	// Output:
	// check
	// true
	// true
	// true
	// true
}
