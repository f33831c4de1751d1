// Command otelcol-gpulse is the OpenTelemetry Collector distribution that gpulse's end-to-end
// tests run (tests/backends/) and that scripts/backends builds: core and contrib components of
// one release (see go.mod), exactly those that otel-config/*.yaml and examples/ use, so every
// shipped configuration can run as shipped without downloading a collector image.
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/otelcol"
)

// version is the core release the components come from; scripts/backends checks that go.mod
// names the same one.
const version = "0.155.0"

func main() {
	info := component.BuildInfo{
		Command:     "otelcol-gpulse",
		Description: "OpenTelemetry Collector with the components gpulse's configurations use",
		Version:     version,
	}
	settings := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// file: for --config PATH, env: for the ${env:VAR} endpoints the configs use,
				// yaml: for --set style overrides on the command line.
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatalf("otelcol-gpulse: %v", err)
	}
}
