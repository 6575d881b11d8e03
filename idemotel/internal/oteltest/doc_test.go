// Package oteltest holds idemotel's tests, which read what the Observer
// records through the OpenTelemetry SDK (go.opentelemetry.io/otel/sdk and
// sdk/metric: in-memory span exporters, manual metric readers): a module
// of its own, so that the SDK stays out of idemotel's go.mod and out of its
// users' module graphs (they bring the SDK and exporters they choose).
package oteltest
