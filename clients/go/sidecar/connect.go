package sidecar

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// probeTimeout bounds connectFailure's call: a connection in
// TRANSIENT_FAILURE answers at once, one still connecting gives no reason.
const probeTimeout = 500 * time.Millisecond

// connectFailure returns why conn is not connected, in grpc-go's words: the
// error of a call that does not wait for the connection (the standard health
// check, served without a token), which carries the last connection
// attempt's failure ("dial unix /x.sock: connect: no such file or
// directory", "connection refused", "x509: certificate signed by unknown
// authority", ErrNoClientCert's text...). Waiting on the connectivity state
// only says "not ready". nil when the call got through or gave no reason
// within probeTimeout. The error is an *Error (the client's interceptor).
func connectFailure(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if e, ok := FromError(err); ok && e.Code == codes.Unavailable && e.Message != "" {
		return e
	}
	return nil
}
