package sidecar

import _ "embed"

// ServiceConfig is the gRPC service config every client of agent-sidecar
// ships (clients/service_config.json in the repository; `make clients` copies
// it here). Dial uses it by default: the idempotent reads (GetSession,
// ListSessions, GetTranscript, SearchMessages, GetSessionContext, GetQueue)
// are retried on UNAVAILABLE; writes and streams never are. Pass
// WithDialOptions(grpc.WithDefaultServiceConfig(...)) to replace it, or
// grpc.WithDisableRetry() to turn retries off.
//
//go:embed service_config.json
var ServiceConfig string
