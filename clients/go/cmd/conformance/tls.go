package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
	"google.golang.org/grpc/codes"
)

// tlsArgs are the TLS scenarios' listeners and PEM files
// (clients/conformance/README.md).
type tlsArgs struct {
	tls, mtls, ca, wrongCA, clientCert, clientKey string
}

// tlsSession returns the scenario source's session id over a TLS listener.
// The connection is lazy, so a refused handshake fails the call at once.
func tlsSession(ctx context.Context, r *runner, sc *scenario, target string, opts ...sidecar.Option) (string, error) {
	src, err := sc.source()
	if err != nil {
		return "", err
	}
	c, err := sidecar.Dial(ctx, target, append(opts, sidecar.WithToken(r.token), sidecar.WithLazyConnect())...)
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.GetOrCreateSession(ctx, src)
	if err != nil {
		return "", err
	}
	return s.GetSessionId(), nil
}

// tlsRefused checks that the listener refuses a client with these options:
// the call fails with the gRPC code named want (e.g. UNAVAILABLE).
func tlsRefused(ctx context.Context, r *runner, sc *scenario, target, want string, opts ...sidecar.Option) error {
	_, err := tlsSession(ctx, r, sc, target, opts...)
	if err == nil {
		return fmt.Errorf("%s accepted the client", target)
	}
	var se *sidecar.Error
	if !errors.As(err, &se) {
		return fmt.Errorf("error is not a *sidecar.Error: %T %v", err, err)
	}
	if got := codeName(se.Code); got != want {
		return fmt.Errorf("refused with %s, want %s: %v", got, want, err)
	}
	return nil
}

// sameSession checks the scenario source's session over TLS is the Unix socket's.
func sameSession(ctx context.Context, r *runner, sc *scenario, target string, opts ...sidecar.Option) error {
	src, err := sc.source()
	if err != nil {
		return err
	}
	uc, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	viaUnix, err := uc.GetOrCreateSession(ctx, src)
	if err != nil {
		return fmt.Errorf("unix: %w", err)
	}
	viaTLS, err := tlsSession(ctx, r, sc, target, opts...)
	if err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	if sc.Expect.SameSessionID && viaTLS != viaUnix.GetSessionId() {
		return fmt.Errorf("unix session %s, tls session %s", viaUnix.GetSessionId(), viaTLS)
	}
	return nil
}

func tlsCustomCA(ctx context.Context, r *runner, sc *scenario) error {
	if r.tlsArgs.tls == "" {
		return errors.New("no --tls target given")
	}
	if err := sameSession(ctx, r, sc, r.tlsArgs.tls, sidecar.WithCAFile(r.tlsArgs.ca)); err != nil {
		return err
	}
	return tlsRefused(ctx, r, sc, r.tlsArgs.tls, sc.Expect.WrongCACode, sidecar.WithCAFile(r.tlsArgs.wrongCA))
}

func mtlsClientCert(ctx context.Context, r *runner, sc *scenario) error {
	if r.tlsArgs.mtls == "" {
		return errors.New("no --mtls target given")
	}
	a := r.tlsArgs
	if err := sameSession(ctx, r, sc, a.mtls, sidecar.WithCAFile(a.ca), sidecar.WithClientCert(a.clientCert, a.clientKey)); err != nil {
		return err
	}
	return tlsRefused(ctx, r, sc, a.mtls, sc.Expect.WithoutClientCertCode, sidecar.WithCAFile(a.ca))
}

// codeName is a code as the protos spell it: Unavailable -> UNAVAILABLE,
// DeadlineExceeded -> DEADLINE_EXCEEDED.
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, ch := range c.String() {
		if i > 0 && unicode.IsUpper(ch) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(ch))
	}
	return b.String()
}
