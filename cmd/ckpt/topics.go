package main

import (
	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/internal/bytesize"
)

// helpTopics are the "ckpt help TOPIC" pages: commands without a Run,
// which cobra lists under "Additional help topics".
func helpTopics() []*cobra.Command {
	topics := []*cobra.Command{
		{
			Use:   "urls",
			Short: "Storage URLs: local paths, file://, mem://, s3://, gs://, plugin schemes",
			Long: `Every command takes storage URLs as arguments:

  ./runs/demo, /abs/dir, file:///abs/dir
      local filesystem (temp file + fsync + rename; confined to the root)
  mem://NAME/prefix
      in-process memory (tests; gone when the process exits)
  s3://bucket/prefix?endpoint=host:port&region=R&insecure=true&path_style=true
        &part_size=16MiB&concurrency=8&multipart_threshold=64MiB
      S3 and S3-compatible stores (MinIO, versitygw, SeaweedFS, ...)
  gs://bucket/prefix?chunk_size=16MiB
      Google Cloud Storage
  SCHEME://...
      a backend plugin's scheme, with --plugin-dir or $CKPTKIT_PLUGIN_DIR

A run URL holds one checkpoint per saved step, as step-NNNNNNNN/ (8-digit
step) below it; a checkpoint URL is one of those. Commands that read a
checkpoint (inspect, diff, convert) accept a run URL for its newest valid
checkpoint. Credentials are never taken from a URL (see "ckpt help env");
URLs in messages are redacted.

Every URL also takes stall_timeout=DURATION (s3://bucket/run?stall_timeout=30s):
an S3 or GCS request with no progress for that long fails as stalled, a
transient error that is retried (exit 5 when the retries run out). Default
60s, or $CKPTKIT_STALL_TIMEOUT; 0 turns it off.

Sizes in URL options and flags: ` + bytesize.Rule + `.`,
			Example: `  ckpt ls ./runs/demo
  ckpt ls "s3://bucket/runs/demo?endpoint=127.0.0.1:9000&insecure=true&path_style=true"
  ckpt ls gs://bucket/runs/demo`,
		},
		{
			Use:   "env",
			Short: "Environment variables: credentials, endpoints, plugins",
			Long: `s3:      AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
         AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials with AWS_PROFILE;
         an instance role; AWS_REGION or AWS_DEFAULT_REGION;
         AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (when the URL has no endpoint)
gs:      Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS,
         gcloud, the metadata server); STORAGE_EMULATOR_HOST for an
         emulator (no authentication)
s3, gs:  CKPTKIT_STALL_TIMEOUT (default 60s, 0: off): how long a request may go
         without progress before it fails as stalled and is retried; a
         URL's stall_timeout option wins
plugins: CKPTKIT_PLUGIN_DIR (as --plugin-dir); pins in DIR/ckptkit-plugins.lock
memory:  GOMEMLIMIT replaces ckpt's own bound (heap within what the last
         garbage collection found live + 96 MiB)

On an access error, ckpt says which credentials it found (never their
values), the endpoint and the region. -vv logs every storage request (each
retry is one more) on stderr.`,
			Example: `  AWS_PROFILE=training ckpt ls s3://bucket/runs/demo
  STORAGE_EMULATOR_HOST=127.0.0.1:4443 ckpt ls gs://bucket/runs/demo
  CKPTKIT_PLUGIN_DIR=./plugins ckpt ls myscheme://run`,
		},
	}
	// cobra prints a topic's Long text only (no usage, so no Example):
	// the examples go at its end.
	for _, t := range topics {
		t.Long += "\n\nExamples:\n" + t.Example
	}
	return topics
}
