package main

import (
	"log/slog"

	"github.com/spf13/cobra"
)

func newRootCmd(in *invocation) *cobra.Command {
	root := &cobra.Command{
		Use:   "ckpt",
		Short: "Save, resume, inspect and verify sharded training checkpoints on any storage",
		Long: `ckpt saves, resumes, inspects, verifies, copies, converts and garbage-collects
sharded training checkpoints on storage chosen by URL: a local path,
file://, mem://, s3://, gs:// or a plugin's scheme (see "ckpt help urls").

Every command takes its URLs as arguments, prints a table for people and,
with --json, one JSON document for programs (schema: docs/CLI.md). Exit
codes say what went wrong: 1 bad checkpoint, 2 usage, 3 not found, 4
access, 5 transient, 6 conflict, 7 unsupported, 10 internal, 130/143
interrupted.`,
		Example: `  ckpt train ./runs/demo --steps 12 --save-every 3
  ckpt ls ./runs/demo
  ckpt verify --deep ./runs/demo/step-00000012
  ckpt copy ./runs/demo/step-00000012 s3://bucket/runs/demo/step-00000012
  ckpt completion bash > /etc/bash_completion.d/ckpt`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newTrainCmd(), newInspectCmd(), newVerifyCmd(), newConformanceCmd(), newLatestCmd(), newLsCmd(), newGCCmd(), newDiffCmd(), newConvertCmd(), newPluginsCmd(), newCopyCmd())
	root.AddCommand(helpTopics()...)
	addGlobalFlags(root, in)
	discover := addPluginFlag(root)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := in.setup(); err != nil {
			return err
		}
		storeLogger = in.logger
		slog.SetDefault(in.logger)
		return discover(cmd)
	}
	return root
}
