package backend

import (
	"context"
	"os"
)

// envKey is the context key of WithEnv.
type envKey struct{}

// WithEnv returns a context whose opens read their environment variables
// (credentials, endpoints, regions, profiles, emulator hosts) from env
// instead of the process environment: a variable absent from env is unset.
// The C ABI passes the caller's environment of the moment this way, since
// the Go runtime of a shared library keeps the copy it took at load
// (golang/go#44108).
func WithEnv(ctx context.Context, env map[string]string) context.Context {
	return context.WithValue(ctx, envKey{}, env)
}

// EnvOf returns the getenv of an open under ctx (Getenv bound to ctx), for
// code that takes one, such as an SDK's configuration.
func EnvOf(ctx context.Context) func(key string) string {
	return func(key string) string { return Getenv(ctx, key) }
}

// Getenv is the value of the environment variable key for an open under
// ctx: from the map of WithEnv when ctx carries one, else from the process
// environment. Drivers read every variable they use through it.
func Getenv(ctx context.Context, key string) string {
	if env, ok := ctx.Value(envKey{}).(map[string]string); ok {
		return env[key]
	}
	return os.Getenv(key)
}
