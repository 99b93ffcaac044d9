package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// Credentials in the shared files named by the environment passed to an
// open (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, AWS_PROFILE, HOME)
// reach the S3 test server, whatever the process environment says (a
// stale file of wrong keys there); a wrong secret in the passed file is
// refused.
func TestS3CredentialFilesComeFromTheEnvironmentPassed(t *testing.T) {
	raw := os.Getenv(ckpttest.S3URLEnv)
	id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if raw == "" || id == "" || secret == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s or the server's keys are not set", ckpttest.S3URLEnv)
		}
		t.Skipf("%s not set (scripts/test-servers.sh)", ckpttest.S3URLEnv)
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	keys := func(section, id, secret string) string {
		return fmt.Sprintf("[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\n", section, id, secret)
	}
	// The process environment: no keys, and files of wrong keys.
	stale := write("stale/credentials", keys("default", "stale-id", "stale-secret")+keys("ckpt", "stale-id", "stale-secret"))
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", stale)
	t.Setenv("AWS_CONFIG_FILE", stale)
	t.Setenv("HOME", filepath.Join(dir, "stale"))

	cases := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"credentials file and profile", map[string]string{
			"AWS_SHARED_CREDENTIALS_FILE": write("a/creds", keys("ckpt", id, secret)), "AWS_PROFILE": "ckpt"}, true},
		{"config file", map[string]string{
			"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "none"),
			"AWS_CONFIG_FILE":             write("b/config", keys("profile ckpt", id, secret)), "AWS_PROFILE": "ckpt"}, true},
		{"files under HOME", map[string]string{"HOME": filepath.Dir(filepath.Dir(write("c/.aws/credentials", keys("default", id, secret))))}, true},
		{"a wrong secret in the file", map[string]string{
			"AWS_SHARED_CREDENTIALS_FILE": write("d/creds", keys("default", id, "wrong-"+secret))}, false},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The endpoint and region the test URL names, from the query.
			env := map[string]string{"HOME": filepath.Join(dir, "nohome")}
			for k, v := range c.env {
				env[k] = v
			}
			sh, err := openStore(backend.WithEnv(ctx, env), raw)
			require.NoError(t, err)
			defer func() { _ = closeStore(sh) }()
			key := "envcreds-" + strings.ReplaceAll(c.name, " ", "-")
			err = sh.st.PutBytes(ctx, key, []byte("hello"), backend.PutOptions{})
			if !c.ok {
				require.Error(t, err)
				assert.Equal(t, ckpterr.Access, ckpterr.ClassOf(err), "%v", err)
				return
			}
			require.NoError(t, err)
			got, err := sh.st.ReadAll(ctx, key, 0)
			require.NoError(t, err)
			assert.Equal(t, "hello", string(got))
			require.NoError(t, sh.st.Delete(ctx, key))
		})
	}
}

// GOOGLE_APPLICATION_CREDENTIALS is taken from the environment passed to an
// open: its file is the one read, not the process environment's.
func TestGCSCredentialsFileComesFromTheEnvironmentPassed(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "adc.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
"client_secret": "s", "refresh_token": "r"}`), 0o600))
	missing := filepath.Join(dir, "missing.json")
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	ctx := context.Background()

	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", missing)
	sh, err := openStore(backend.WithEnv(ctx, map[string]string{"GOOGLE_APPLICATION_CREDENTIALS": good}), "gs://bucket/p")
	require.NoError(t, err, "the passed file, not the process environment's missing one")
	require.NoError(t, closeStore(sh))

	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", good)
	_, err = openStore(backend.WithEnv(ctx, map[string]string{"GOOGLE_APPLICATION_CREDENTIALS": missing}), "gs://bucket/p")
	require.Error(t, err, "the passed (missing) file, not the process environment's")
	assert.Contains(t, err.Error(), "missing.json")
}
