package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/plugins/host"
)

// loadedPlugins are the plugins discovered for this invocation.
var loadedPlugins []*host.Plugin

// addPluginFlag adds --plugin-dir to root and returns the function that
// discovers the plugins in it (or in $CKPTKIT_PLUGIN_DIR) before any
// command runs, so their schemes work in every URL.
func addPluginFlag(root *cobra.Command) func(cmd *cobra.Command) error {
	var dir string
	root.PersistentFlags().StringVar(&dir, host.FlagPluginDir, "",
		"directory of backend plugins to load (default $"+host.EnvPluginDir+")")
	return func(cmd *cobra.Command) error {
		source := "--" + host.FlagPluginDir
		if dir == "" {
			dir, source = os.Getenv(host.EnvPluginDir), "$"+host.EnvPluginDir
		}
		if dir == "" {
			return nil
		}
		ps, err := host.Discover(cmd.Context(), host.Config{Dir: dir, Logger: pluginLogger(inv(cmd))})
		if err != nil {
			return usage(fmt.Errorf("load plugins from %s=%s (fix or unset it): %w", source, dir, err))
		}
		loadedPlugins = ps
		return nil
	}
}

// pluginLogger passes go-plugin's and the plugins' log lines to stderr at
// the level of -v/--log-level.
func pluginLogger(in *invocation) hclog.Logger {
	level := hclog.Warn
	switch {
	case in.logs(slog.LevelDebug):
		level = hclog.Debug
	case in.logs(slog.LevelInfo):
		level = hclog.Info
	case !in.logs(slog.LevelWarn):
		level = hclog.Error
	}
	return hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: level, Output: in.stderr})
}

type pluginInfo struct {
	Name    string   `json:"name"`
	Version string   `json:"version"`
	Path    string   `json:"path"`
	Schemes []string `json:"schemes"`
	SHA256  string   `json:"sha256"`
	Pinned  bool     `json:"pinned"`
}

// pluginsOutput is the --json document of ckpt plugins list.
type pluginsOutput struct {
	header
	Plugins []pluginInfo `json:"plugins"`
}

func newPluginsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "plugins", Short: "Backend plugins", Long: "Backend plugins: executables in --plugin-dir (or $" + host.EnvPluginDir + ") that serve URL schemes (docs/PLUGINS.md).",
		Example: "  ckpt --plugin-dir ./plugins plugins list"}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the plugins found in --plugin-dir: name, path, schemes, version, checksum",
		Example: `  ckpt --plugin-dir ./plugins plugins list
  CKPTKIT_PLUGIN_DIR=./plugins ckpt plugins list --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			infos := []pluginInfo{}
			for _, p := range loadedPlugins {
				infos = append(infos, pluginInfo{Name: p.Name, Version: p.Version, Path: p.Path, Schemes: p.Schemes, SHA256: p.SHA256, Pinned: p.Pinned})
			}
			if asJSON {
				emit(cmd, &pluginsOutput{Plugins: infos})
				return nil
			}
			if len(infos) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "no plugins (set --%s or $%s)\n", host.FlagPluginDir, host.EnvPluginDir)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tSCHEMES\tPINNED\tSHA256\tPATH")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", safe(i.Name), safe(i.Version), safe(strings.Join(i.Schemes, ",")), i.Pinned, i.SHA256, safe(i.Path))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.AddCommand(list)
	return cmd
}
