package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/plugins/host"
)

// loadedPlugins are the plugins discovered for this invocation.
var loadedPlugins []*host.Plugin

// addPluginFlag adds --plugin-dir to root and discovers the plugins in it
// (or in $CKPTKIT_PLUGIN_DIR) before any command runs, so their schemes
// work in every URL.
func addPluginFlag(root *cobra.Command) {
	var dir string
	root.PersistentFlags().StringVar(&dir, host.FlagPluginDir, os.Getenv(host.EnvPluginDir),
		"directory of backend plugins to load (default $"+host.EnvPluginDir+")")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if dir == "" {
			return nil
		}
		ps, err := host.Discover(cmd.Context(), host.Config{Dir: dir})
		if err != nil {
			return usage(fmt.Errorf("load plugins from %s: %w", dir, err))
		}
		loadedPlugins = ps
		return nil
	}
}

type pluginInfo struct {
	Name    string   `json:"name"`
	Version string   `json:"version"`
	Path    string   `json:"path"`
	Schemes []string `json:"schemes"`
	SHA256  string   `json:"sha256"`
	Pinned  bool     `json:"pinned"`
}

func newPluginsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "plugins", Short: "Backend plugins"}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the plugins found in --plugin-dir: name, path, schemes, version, checksum",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			infos := []pluginInfo{}
			for _, p := range loadedPlugins {
				infos = append(infos, pluginInfo{Name: p.Name, Version: p.Version, Path: p.Path, Schemes: p.Schemes, SHA256: p.SHA256, Pinned: p.Pinned})
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), infos)
			}
			if len(infos) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "no plugins (set --%s or $%s)\n", host.FlagPluginDir, host.EnvPluginDir)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tSCHEMES\tPINNED\tSHA256\tPATH")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", i.Name, i.Version, strings.Join(i.Schemes, ","), i.Pinned, i.SHA256, i.Path)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(list)
	return cmd
}
