package sidecar

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// dialError dials target, waiting at most 300 ms for the connection.
func dialError(t *testing.T, target string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c, err := Dial(ctx, target)
	if err == nil {
		c.Close()
		t.Fatalf("%s was ready", target)
	}
	return err
}

// A Dial that runs out of time says why the connection is not ready, in
// grpc-go's words, as an *Error it wraps beside ctx.Err(). Before, it said
// only "not ready (TRANSIENT_FAILURE): context deadline exceeded", whether
// the socket was missing or the port refused. (A certificate that fails
// verification: the conformance suite's connect_failure_reason.)
func TestDialSaysWhyTheSidecarIsOutOfReach(t *testing.T) {
	err := dialError(t, "unix:"+filepath.Join(t.TempDir(), "nobody.sock"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("does not wrap ctx.Err(): %v", err)
	}
	var se *Error
	if !errors.As(err, &se) || se.Code != codes.Unavailable || se.Reason != "" {
		t.Fatalf("no *Error Unavailable in %v", err)
	}
	if !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("the missing socket is not named: %v", err)
	}

	l, lerr := net.Listen("tcp", "127.0.0.1:0") // a free port, then freed: nothing listens there
	if lerr != nil {
		t.Fatal(lerr)
	}
	addr := l.Addr().String()
	l.Close()
	if err := dialError(t, addr); !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("the refusal is not named: %v", err)
	}
}

// gRPC's own ipv4:/ipv6: targets are named as a scheme the client does not
// dial; before, ipv4:127.0.0.1:1 (its host read as "ipv4") was told that an
// IPv6 address goes in brackets.
func TestGRPCAddressSchemesAreNamed(t *testing.T) {
	for _, target := range []string{"ipv4:127.0.0.1:1", "ipv6:[::1]:1"} {
		_, err := Dial(context.Background(), target, WithLazyConnect())
		if err == nil || !strings.Contains(err.Error(), "scheme, which this client does not dial: give the address alone") {
			t.Errorf("%s: %v", target, err)
		}
	}
}
