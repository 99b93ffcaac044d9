package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "ckpt",
		Short:         "Save, resume, inspect and verify sharded training checkpoints on any storage",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newTrainCmd(), newInspectCmd(), newVerifyCmd(), newConformanceCmd(), newLatestCmd(), newLsCmd(), newGCCmd(), newDiffCmd(), newConvertCmd(), newPluginsCmd(), newCopyCmd())
	addPluginFlag(root)
	return root
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
