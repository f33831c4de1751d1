//go:build tools

// Package tools pins telemetrygen, the OpenTelemetry Collector project's load generator, so that
// scripts/backends builds one reproducible version of it.
package tools

import _ "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen"
